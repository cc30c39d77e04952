"""The OpenAI Responses API (`/v1/responses`) as a chat completion, and back.

A Responses request is translated into the proxy's own chat request (`to_chat`), which
then takes the chat endpoint's path (its checks, QAS scheduling, the token path or the
engine's chat endpoint with its tool-call parser); the chat answer is translated back
into a Response object (`to_response`) or, streamed, into the Responses events
(`ResponseEvents`). Everything here is pure: ids and timestamps come in as arguments.

Served: `input` as a string or a list of items (messages with text parts,
`function_call` and `function_call_output` items; `reasoning` items are dropped, as the
chat template never sees them), `instructions`, function `tools`, `tool_choice`,
`parallel_tool_calls`, `max_output_tokens`, `temperature`, `top_p`, `stream`, `metadata`
(echoed), `store` (nothing is stored), `text.format`, `user`, `prompt_cache_key`.
Refused with a 400 naming the field: what needs stored responses or conversations
(`previous_response_id`, `conversation`, `item_reference` items), hosted tools, media
inputs, and fields that ask for what a chat completion cannot give (`include`,
`reasoning`, `truncation: auto`, ...). Fields the Responses API does not know are
dropped, as the chat endpoint drops fields SGLang does not know.

Modules: `request` (the body and what is refused), `to_chat` (the request as a chat),
`answer` (a chat answer as a Response object), `events` (a streamed answer as events).
"""
