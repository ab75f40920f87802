from __future__ import annotations

from policies.text import block_hashes, estimate_tokens, last_user_text, prompt_text


def test_prompt_text_of_chat_and_completion_bodies() -> None:
    chat = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        ]
    }
    assert prompt_text(chat) == "be brief\nhi"
    assert last_user_text(chat) == "hi"
    assert prompt_text({"prompt": "abc"}) == "abc"
    assert prompt_text({"prompt": ["a", "b"]}) == "a\nb"


def test_estimate_tokens() -> None:
    assert estimate_tokens("") == 1
    assert estimate_tokens("abcd") == 1
    assert estimate_tokens("abcde") == 2


def test_block_hashes_are_chained_prefix_hashes() -> None:
    a = block_hashes("a" * 64 + "b" * 64 + "c" * 10, 16)
    b = block_hashes("a" * 64 + "b" * 64 + "d" * 70, 16)
    c = block_hashes("z" * 64 + "b" * 64, 16)
    assert len(a) == 2 and a == b[:2]
    assert a[1] != c[1]  # same block, different prefix
