"""Request bodies of the OpenAI and Ollama APIs, validated by pydantic (unknown fields are ignored).

Validation errors name the field (`messages.0.role`), so a client learns what to fix.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


# OpenAI ----------------------------------------------------------------------------------------------
class ContentPart(_Body):
    type: str
    text: Optional[str] = None


class FunctionCall(_Body):
    name: str
    arguments: Union[str, dict] = "{}"


class ToolCallIn(_Body):
    id: Optional[str] = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCallIn]] = None
    tool_call_id: Optional[str] = None


class FunctionDef(_Body):
    name: str
    description: Optional[str] = None
    parameters: Optional[dict] = None


class ToolDef(_Body):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Body):
    include_usage: bool = False


class _Sampling(_Body):
    model: Optional[str] = None
    max_tokens: Optional[int] = Field(None, ge=1)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)            # an extension (vLLM, llama.cpp)
    seed: Optional[int] = None
    stop: Union[str, list[str], None] = None
    n: Optional[int] = Field(None, ge=1)
    stream: bool = False
    stream_options: Optional[StreamOptions] = None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, ge=1)
    tools: Optional[list[ToolDef]] = None
    tool_choice: Union[str, dict, None] = None
    response_format: Optional[dict] = None
    logprobs: Optional[bool] = None
    top_logprobs: Optional[int] = Field(None, ge=0, le=20)


class CompletionRequest(_Sampling):
    prompt: Union[str, list[int], list[str]]
    response_format: Optional[dict] = None              # an extension (vLLM): structured output here too
    logprobs: Optional[int] = Field(None, ge=0, le=20)  # the legacy API: how many alternatives per token


# Ollama ----------------------------------------------------------------------------------------------
class OllamaOptions(_Body):
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=0)
    seed: Optional[int] = None
    num_predict: Optional[int] = None                   # -1 or absent: until the context is full
    stop: Union[str, list[str], None] = None


class OllamaToolCallFunction(_Body):
    name: str
    arguments: Union[dict, str] = Field(default_factory=dict)


class OllamaToolCall(_Body):
    function: OllamaToolCallFunction


class OllamaMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    images: Optional[list[Any]] = None
    tool_calls: Optional[list[OllamaToolCall]] = None


class OllamaChatRequest(_Body):
    model: Optional[str] = None
    messages: list[OllamaMessage] = Field(default_factory=list)
    stream: bool = True
    options: Optional[OllamaOptions] = None
    tools: Optional[list[ToolDef]] = None
    format: Union[str, dict, None] = None               # structured output: "json" or a JSON Schema


class OllamaGenerateRequest(_Body):
    model: Optional[str] = None
    prompt: str = ""
    system: Optional[str] = None
    raw: bool = False
    stream: bool = True
    images: Optional[list[Any]] = None
    options: Optional[OllamaOptions] = None
    format: Union[str, dict, None] = None


class OllamaShowRequest(_Body):
    model: Optional[str] = None
    name: Optional[str] = None                          # the older field name
