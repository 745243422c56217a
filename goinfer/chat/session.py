"""ChatSession: a Session that takes a conversation (``Model.session()`` returns one).

The session knows tokens; this adds messages: the conversation is rendered with the model's
chat template (tools in the model's own call format), its reply constrained and parsed back
into content, reasoning and tool calls (goinfer/chat/request.py).
"""

from __future__ import annotations

from goinfer.chat.request import prepare_chat
from goinfer.sampling import SamplingParams, sampling_params
from goinfer.session import Session
from goinfer.speculative import DEFAULT_DRAFT_TOKENS

__all__ = ["ChatSession"]


class ChatSession(Session):
    def chat(
        self,
        messages,
        params: SamplingParams | None = None,
        *,
        max_tokens: int = 64,
        stream: bool = False,
        stop=None,
        response_format=None,
        grammar=None,
        logprobs: bool = False,
        top_logprobs: int = 0,
        draft: str | None = None,
        draft_tokens: int = DEFAULT_DRAFT_TOKENS,
        tools=None,
        tool_choice=None,
        parallel_tool_calls=None,
        chat_template_kwargs=None,
        **overrides,
    ):
        """Apply the model's chat template to the whole conversation and generate the reply
        (params, sampling keywords, stop, response_format, grammar, logprobs, top_logprobs,
        draft: as Session.generate).

        tools, tool_choice ("auto" | "none" | "required" | {"type": "function", "function":
        {"name": ...}}) and parallel_tool_calls as in OpenAI's API (goinfer/chat/): the
        result's ``tool_calls`` holds the calls, ``content`` the rest of the text, and
        finish_reason is "tool_calls".  With stream=True the iterator gives content strings
        and ToolCallDelta pieces, then the result.  Bad tool input raises ToolError.

        A reasoning model's thinking (``<think>`` blocks, gpt-oss's analysis channel;
        goinfer/chat/channels.py) goes to ``result.reasoning_content``, streamed as
        ``Reasoning`` pieces.  chat_template_kwargs: more variables for the chat template
        (``{"enable_thinking": False}``, gpt-oss's ``reasoning_effort``)."""
        params = sampling_params(params, overrides, "chat", self.model.sampling_defaults)
        tc = prepare_chat(
            self.model, messages, tools, tool_choice, parallel_tool_calls, chat_template_kwargs
        )
        ids = self.model.tokenize_chat(tc.prompt)
        response_format, grammar = tc.constraint(response_format, grammar)
        out = self.generate(
            ids,
            params,
            max_tokens=max_tokens,
            stream=stream,
            stop=stop,
            response_format=response_format,
            grammar=grammar,
            logprobs=logprobs,
            top_logprobs=top_logprobs,
            draft=draft,
            draft_tokens=draft_tokens,
        )
        return tc.stream(out) if stream else tc.finish(out)
