"""The context overflow policy (Qt-free): which turns are sent when a chat outgrows the context."""
import pytest

from app.context_policy import fit_chat
from engine import SluiceError


def count_words(messages):
    """A stand-in tokenizer: one token per word plus 3 per message (the template's markers)."""
    return sum(len(m["content"].split()) + 3 for m in messages)


def chat(num_exchanges, words=20, system=True):
    messages = [{"role": "system", "content": "be brief"}] if system else []
    for i in range(num_exchanges):
        messages.append({"role": "user", "content": f"question{i} " + "w " * (words - 1)})
        messages.append({"role": "assistant", "content": f"answer{i} " + "w " * (words - 1)})
    messages.append({"role": "user", "content": "last question"})
    return messages


def test_a_chat_that_fits_is_sent_whole_with_the_answer_limit_as_asked():
    messages = chat(2)
    fitted = fit_chat(messages, count_words, max_context=1000, max_new_tokens=100)
    assert fitted.messages == messages and fitted.dropped == [] and fitted.max_new_tokens == 100


def test_middle_keeps_system_prompt_and_first_exchange_and_drops_the_turns_after_it():
    messages = chat(10)                     # 5 + 10 * 46 + 5 = 470 tokens
    fitted = fit_chat(messages, count_words, max_context=300, max_new_tokens=64, policy="middle")
    assert count_words(fitted.messages) + 64 <= 300
    assert fitted.messages[:3] == messages[:3]                     # system, first question, first answer
    assert fitted.messages[-1] == messages[-1]
    assert fitted.dropped[0] == 3 and fitted.dropped == list(range(3, fitted.dropped[-1] + 1))
    assert messages[fitted.dropped[-1] + 1]["role"] == "user"      # kept turns start with a question
    assert fitted.max_new_tokens == 64


def test_rolling_window_drops_the_oldest_turns_but_keeps_the_system_prompt():
    messages = chat(10)
    fitted = fit_chat(messages, count_words, max_context=300, max_new_tokens=64, policy="rolling")
    assert fitted.messages[0]["role"] == "system" and fitted.dropped[0] == 1
    assert fitted.messages[1]["content"].startswith("question")
    assert "question0" not in " ".join(m["content"] for m in fitted.messages)


def test_the_answer_limit_is_lowered_to_the_room_left_not_past_the_context():
    messages = chat(1)                                             # 56 tokens
    fitted = fit_chat(messages, count_words, max_context=100, max_new_tokens=90)
    assert fitted.dropped == [] and fitted.max_new_tokens == 100 - 56


def test_one_message_longer_than_the_context_says_so_with_its_size():
    messages = [{"role": "user", "content": "w " * 500}]
    with pytest.raises(SluiceError, match=r"This message is too long: your message takes 503 tokens.*holds 600 "):
        fit_chat(messages, count_words, max_context=600, max_new_tokens=512)


def test_stop_policy_asks_for_a_new_chat():
    with pytest.raises(SluiceError, match="This chat is full.*start a new chat"):
        fit_chat(chat(10), count_words, max_context=300, max_new_tokens=64, policy="stop")
