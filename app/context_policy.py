"""What to send when a chat outgrows the model's context. Qt-free.

The engine's KV cache holds `max_context` tokens: the prompt (the whole chat, templated) plus the
answer. When the chat is longer, older turns are left out, as LM Studio does:

    "middle"   keep the system prompt and the first exchange, drop the turns after it (default)
    "rolling"  keep the system prompt, drop the oldest turns
    "stop"     drop nothing: the user is told to start a new chat

The answer keeps room for min(max_new_tokens, max_context // ANSWER_SHARE) tokens; a shorter answer
limit than asked is reported (never silent).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine import SluiceError

POLICIES = {"middle": "Keep the first exchange, drop the middle",
            "rolling": "Rolling window: drop the oldest turns",
            "stop": "Stop: ask for a new chat"}
DEFAULT_POLICY = "middle"
ANSWER_SHARE = 4       # an answer may always use up to a quarter of the context


@dataclass
class FittedChat:
    messages: list[dict]                 # what the engine gets
    num_prompt_tokens: int
    max_new_tokens: int                  # the answer limit, lowered when the context leaves less room
    dropped: list[int] = field(default_factory=list)    # indexes (in the given messages) left out


def fit_chat(messages: list[dict], count_tokens, max_context: int, max_new_tokens: int,
             policy: str = DEFAULT_POLICY) -> FittedChat:
    """Choose the messages that fit `max_context` with room for the answer.

    count_tokens(messages) -> prompt tokens with the chat template applied. Raises SluiceError with
    what to do when even the last message alone (with the system prompt) does not fit.
    """
    answer_room = max(1, min(max_new_tokens, max_context // ANSWER_SHARE))
    budget = max_context - answer_room
    num_tokens = count_tokens(messages)
    if num_tokens <= budget:
        return FittedChat(list(messages), num_tokens, min(max_new_tokens, max_context - num_tokens))

    head = 1 if messages and messages[0]["role"] == "system" else 0
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=len(messages) - 1)
    _check_it_can_fit(messages, count_tokens, head, last_user, budget, max_context, answer_room)
    if policy == "stop":
        raise SluiceError(f"This chat is full: it takes {num_tokens:,} tokens and the model's context holds "
                          f"{max_context:,} including room for the answer; start a new chat, or choose "
                          f"another context overflow policy in Chat settings.")
    if policy == "middle":
        first_exchange = _first_exchange_end(messages, head)
        if first_exchange < last_user and count_tokens(messages[:first_exchange] + messages[last_user:]) <= budget:
            head = first_exchange                # else the first exchange goes too, as in a rolling window
    # drop messages[head:cut] for the smallest cut that fits (more dropped never costs more tokens)
    low, high = head, last_user
    while low < high:
        cut = (low + high) // 2
        if count_tokens(messages[:head] + messages[cut:]) <= budget:
            high = cut
        else:
            low = cut + 1
    if low > head and messages[low]["role"] == "assistant":
        low += 1                             # never start the kept turns with an answer to a dropped question
    kept = messages[:head] + messages[low:]
    num_tokens = count_tokens(kept)
    return FittedChat(kept, num_tokens, min(max_new_tokens, max_context - num_tokens), list(range(head, low)))


def _check_it_can_fit(messages, count_tokens, head: int, last_user: int, budget: int, max_context: int,
                      answer_room: int) -> None:
    """SluiceError when even the last message alone (with the system prompt) does not fit."""
    alone_tokens = count_tokens(messages[:head] + messages[last_user:])
    if alone_tokens > budget:
        what = "your message with the system prompt" if head else "your message"
        raise SluiceError(f"This message is too long: {what} takes {alone_tokens:,} tokens, and the model's "
                          f"context holds {max_context:,} tokens including room for a {answer_room:,}-token "
                          f"answer; shorten it, or raise the context in Settings.")


def _first_exchange_end(messages: list[dict], head: int) -> int:
    """Index after the first user message and the answer that follows it."""
    index = head
    while index < len(messages) and messages[index]["role"] != "user":
        index += 1
    index += 1
    while index < len(messages) and messages[index]["role"] == "assistant":
        index += 1
    return index
