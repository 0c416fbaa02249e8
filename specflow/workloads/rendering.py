"""The exact text of a prompt: system prompt, few-shot examples, chat history, last user turn.

Chat template: specflow renders it itself with the target's tokenizer, because the bench's
custom dataset can only wrap the whole prompt in one user turn, which would lose the system
turn, few-shot turns and chat history. A leading BOS the template writes is dropped when the
tokenizer adds one itself (the server tokenizes completion prompts with special tokens), so
requests never start with two BOS.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from specflow.spec.errors import Problem, SpecError
from specflow.spec.schema import WorkloadSpec
from specflow.workloads.model import Example

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase as Tokenizer

Message = dict[str, Any]
"""One chat turn: {"role": ..., "content": ...} (a logged turn may carry tool_calls too)."""


def render(name: str, spec: WorkloadSpec, shots: Sequence[Example], example: Example,
           tokenizer: Tokenizer | None = None) -> str:
    """The exact prompt text sent for `example`: system prompt, few-shot examples, history.

    With `chat_template` the turns are rendered by the tokenizer's own template (a system turn
    it rejects is folded into the first user turn); without it they are joined as plain text.
    """
    if example.request is not None:
        return _logged(name, spec, example, tokenizer)
    if not spec.chat_template:
        return _plain(spec, shots, example)
    if tokenizer is None:
        raise SpecError([Problem(
            f"workload.{name}.chat_template", "rendering the chat template needs the target's "
            "tokenizer", True, "a tokenizer (materialize(..., tokenizer=<target tokenizer "
            "directory or cached id>)) or chat_template=false")])
    messages: list[Message] = []
    for s in shots:
        messages += [{"role": "user", "content": s.prompt},
                     {"role": "assistant", "content": s.answer or ""}]
    messages += [{"role": r, "content": t} for r, t in example.history]
    messages.append({"role": "user", "content": example.prompt})
    return _apply_template(name, tokenizer, spec.system_prompt, messages)


def _logged(name: str, spec: WorkloadSpec, example: Example, tok: Tokenizer | None) -> str:
    """A logged request as the server would render it: a completion prompt as it is; chat turns
    (and the tools offered) through the target's chat template, tool-call arguments parsed from
    their JSON text as vLLM's server parses them."""
    req = example.request
    assert req is not None
    if req.messages is None:
        return req.prompt or ""
    messages = [_server_turn(m) for m in req.messages]
    system = spec.system_prompt if not any(m["role"] in ("system", "developer")
                                           for m in messages) else None
    if not spec.chat_template:
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in messages]
        return "\n".join(([system] if system else []) + lines + ["Assistant:"])
    if tok is None:
        return render(name, spec, (), Example(""), None)  # the problem: no tokenizer
    return _apply_template(name, tok, system, messages, list(req.tools) or None,
                           dict(req.template_kwargs))


def _server_turn(m: Message) -> Message:
    turn = dict(m)
    calls = turn.get("tool_calls")
    if isinstance(calls, list):
        parsed = []
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
                with contextlib.suppress(json.JSONDecodeError):
                    call = {**call, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
            parsed.append(call)
        turn["tool_calls"] = parsed
    return turn


def _plain(spec: WorkloadSpec, shots: Sequence[Example], example: Example) -> str:
    """The turns joined as plain text, history as `User:`/`Assistant:` lines."""
    parts = [spec.system_prompt] if spec.system_prompt else []
    parts += [_join(s.prompt, s.answer or "") for s in shots]
    if example.history:
        turns = [f"{role.capitalize()}: {text}" for role, text in example.history]
        parts.append("\n".join([*turns, f"User: {example.prompt}", "Assistant:"]))
    else:
        parts.append(example.prompt)
    return "\n\n".join(parts)


def _join(prompt: str, answer: str) -> str:
    return prompt + answer if prompt.endswith("\n") else f"{prompt}\n{answer}"


def _apply_template(name: str, tok: Tokenizer, system: str | None,
                    messages: list[Message], tools: list[dict[str, Any]] | None = None,
                    kwargs: dict[str, Any] | None = None) -> str:
    if not getattr(tok, "chat_template", None):
        raise SpecError([Problem(
            f"workload.{name}.chat_template", "the tokenizer has no chat template", True,
            "false for this tokenizer (or a tokenizer that ships a chat template)")])
    from jinja2 import TemplateError

    def apply(msgs: list[Message]) -> str:
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False,
                                       add_generation_prompt=True, **(kwargs or {}))
        assert isinstance(text, str)  # tokenize=False renders text
        return text

    try:
        try:
            text = apply(([{"role": "system", "content": system}] if system else []) + messages)
        except TemplateError:
            if not system:
                raise
            first = dict(messages[0], content=f"{system}\n\n{messages[0]['content']}")
            text = apply([first, *messages[1:]])  # templates without a system role
    except (TemplateError, TypeError) as exc:
        raise SpecError([Problem(
            f"workload.{name}.chat_template", f"the tokenizer's chat template rejects the "
            f"conversation ({exc})", True, "false, or few_shot/system_prompt the template "
            "accepts")]) from None
    bos = getattr(tok, "bos_token", None)
    if bos and text.startswith(bos) and _adds_bos(tok):
        text = text[len(bos):]
    return text


def _adds_bos(tok: Tokenizer) -> bool:
    ids = tok("a").input_ids
    return bool(ids) and ids[0] == getattr(tok, "bos_token_id", None)
