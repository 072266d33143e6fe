"""Drives a running `ft-actor serve` with the official `openai` and `anthropic` SDKs.

Usage: python3 tests/python/test_sdk.py http://127.0.0.1:PORT

The served model is the demo model (random weights), so the checks are about the protocol:
every endpoint answers in the shape the SDK parses, streams are well-formed and complete,
usage is reported, errors raise the SDK's own exception classes. Prints one line per test
and a closing `N passed, N failed`; exits 1 on any failure.
"""

import json
import sys
import traceback

import anthropic
import openai

BASE = sys.argv[1].rstrip("/") if len(sys.argv) > 1 else "http://127.0.0.1:8080"
MODEL = "ft-actor-demo"
oa = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0, timeout=120)
an = anthropic.Anthropic(base_url=BASE, api_key="unused", max_retries=0, timeout=120)

WEATHER_OA = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
WEATHER_AN = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}

TESTS = []


def test(fn):
    TESTS.append(fn)
    return fn


def check_chat_message(msg):
    assert msg.role == "assistant"
    assert msg.content is None or isinstance(msg.content, str)
    for call in msg.tool_calls or []:
        assert call.type == "function" and call.id
        json.loads(call.function.arguments)


@test
def models_list():
    models = oa.models.list()
    ids = [m.id for m in models.data]
    assert ids == [MODEL], ids
    assert oa.models.retrieve(MODEL).id == MODEL


@test
def chat_completion():
    r = oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}],
        max_tokens=8,
        temperature=0.7,
        top_p=0.9,
        seed=7,
    )
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls"), c.finish_reason
    check_chat_message(c.message)
    u = r.usage
    assert u.prompt_tokens > 0 and u.completion_tokens <= 8
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens
    assert u.prompt_tokens_details.cached_tokens >= 0


@test
def chat_completion_seeded_greedy_is_reproducible():
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Count"}], max_completion_tokens=6, temperature=0)
    a = oa.chat.completions.create(**args).choices[0].message
    b = oa.chat.completions.create(**args).choices[0].message
    assert (a.content, a.reasoning_content if hasattr(a, "reasoning_content") else None) == (
        b.content,
        b.reasoning_content if hasattr(b, "reasoning_content") else None,
    )


@test
def chat_completion_stream_with_usage():
    stream = oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a story"}],
        max_tokens=12,
        stream=True,
        stream_options={"include_usage": True},
    )
    finishes, usage, chunks = [], None, 0
    for chunk in stream:
        chunks += 1
        assert chunk.object == "chat.completion.chunk"
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
    assert len(finishes) == 1, finishes
    assert usage is not None and usage.completion_tokens <= 12 and usage.prompt_tokens > 0
    assert chunks >= 2


@test
def chat_completion_several_choices_streamed_and_not():
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=5, temperature=0, n=2,
                extra_body={"ignore_eos": True})
    r = oa.chat.completions.create(**args)
    assert [c.index for c in r.choices] == [0, 1] and r.usage.completion_tokens == 10
    text, finishes, usage = ["", ""], [0, 0], None
    for chunk in oa.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.delta.content or ""
            finishes[c.index] += bool(c.finish_reason)
    assert finishes == [1, 1], finishes
    assert text == [c.message.content for c in r.choices], (text, r.choices)
    assert usage is not None and usage.completion_tokens == 10


@test
def chat_completion_logprobs_streamed_and_not():
    args = dict(model=MODEL, messages=[{"role": "user", "content": "Hello!"}], max_tokens=6, temperature=0,
                logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    r = oa.chat.completions.create(**args)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == 6, len(content)
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert abs(t.logprob - t.top_logprobs[0].logprob) < 1e-6  # greedy picks the best
    streamed = []
    for chunk in oa.chat.completions.create(stream=True, **args):
        for c in chunk.choices:
            if c.logprobs and c.logprobs.content:
                streamed.extend(c.logprobs.content)
    assert [t.token for t in streamed] == [t.token for t in content]
    assert all(abs(a.logprob - b.logprob) < 1e-5 for a, b in zip(streamed, content))


BOUNDED = {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
           "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": False}


def check_bounded(args):
    assert args["city"] in ("Paris", "Rome", "Oslo") and 1 <= args["days"] <= 7 and len(args) == 2, args


@test
def forced_tool_calls_and_json_schema_on_both_apis():
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": BOUNDED, "strict": True}}
    args = dict(model=MODEL, messages=[{"role": "user", "content": "weather?"}], max_tokens=200, tools=[tool],
                tool_choice={"type": "function", "function": {"name": "get_weather"}})
    r = oa.chat.completions.create(**args)
    call = r.choices[0].message.tool_calls[0]
    assert r.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    check_bounded(json.loads(call.function.arguments))
    parts, finish = [], None
    for chunk in oa.chat.completions.create(stream=True, **args):
        for c in chunk.choices:
            for tc in c.delta.tool_calls or []:
                parts.append(tc.function.arguments or "")
            finish = c.finish_reason or finish
    assert finish == "tool_calls", finish
    check_bounded(json.loads("".join(parts)))
    r = oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "weather?"}], max_tokens=200,
                                   response_format={"type": "json_schema", "json_schema": {"name": "w", "schema": BOUNDED, "strict": True}})
    check_bounded(json.loads(r.choices[0].message.content))
    for stream in (False, True):
        kw = dict(model=MODEL, max_tokens=200, messages=[{"role": "user", "content": "weather?"}],
                  tools=[{"name": "get_weather", "description": "Weather", "input_schema": BOUNDED}], tool_choice={"type": "any"})
        if stream:
            with an.messages.stream(**kw) as s:
                m = s.get_final_message()
        else:
            m = an.messages.create(**kw)
        uses = [b for b in m.content if b.type == "tool_use"]
        assert m.stop_reason == "tool_use" and uses and uses[0].name == "get_weather", m
        check_bounded(uses[0].input)


@test
def chat_completion_with_tools_and_tool_history():
    r = oa.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
            {"role": "user", "content": "And in Rome?"},
        ],
        tools=[WEATHER_OA],
        tool_choice="auto",
        max_tokens=10,
    )
    check_chat_message(r.choices[0].message)
    # The tool schema is rendered into the prompt by the chat template.
    plain = oa.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], max_tokens=1
    )
    tooled = oa.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather in Paris?"}], tools=[WEATHER_OA], max_tokens=1
    )
    assert tooled.usage.prompt_tokens > plain.usage.prompt_tokens + 20


@test
def chat_completion_stream_with_tools():
    stream = oa.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Weather?"}], tools=[WEATHER_OA], max_tokens=10, stream=True
    )
    done = False
    for chunk in stream:
        for ch in chunk.choices:
            for call in ch.delta.tool_calls or []:
                assert call.index >= 0
            done = done or ch.finish_reason is not None
    assert done


@test
def completions():
    r = oa.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and len(r.choices) == 1
    assert isinstance(r.choices[0].text, str)
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens <= 6
    echoed = oa.completions.create(model=MODEL, prompt="Echo me", max_tokens=2, echo=True, temperature=0)
    assert echoed.choices[0].text.startswith("Echo me")


@test
def completions_stream():
    stream = oa.completions.create(
        model=MODEL, prompt=[1, 2, 3, 4], max_tokens=5, stream=True, stream_options={"include_usage": True}
    )
    finishes, usage = [], None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
    assert len(finishes) == 1 and usage is not None and usage.prompt_tokens == 4


@test
def completions_several_choices_streamed_and_not():
    args = dict(model=MODEL, prompt="Echo me", max_tokens=4, temperature=0.9, seed=5, n=3, echo=True,
                extra_body={"ignore_eos": True})
    r = oa.completions.create(**args)
    assert [c.index for c in r.choices] == [0, 1, 2] and r.usage.completion_tokens == 12
    assert all(c.text.startswith("Echo me") for c in r.choices)
    assert len({c.text for c in r.choices}) > 1, "seeds are offset per choice"
    text, finishes, usage = ["", "", ""], [0, 0, 0], None
    for chunk in oa.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            text[c.index] += c.text
            finishes[c.index] += bool(c.finish_reason)
    assert finishes == [1, 1, 1], finishes
    assert text == [c.text for c in r.choices], (text, [c.text for c in r.choices])
    assert usage is not None and usage.completion_tokens == 12


@test
def responses_create_retrieve_and_continue():
    r = oa.responses.create(model=MODEL, input="Say hi", instructions="Be brief.", max_output_tokens=8)
    assert r.object == "response" and r.id.startswith("resp_")
    assert r.status in ("completed", "incomplete"), r.status
    assert isinstance(r.output_text, str)
    assert r.usage.input_tokens > 0 and r.usage.output_tokens <= 8
    for item in r.output:
        assert item.type in ("message", "reasoning", "function_call"), item.type
    got = oa.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text
    follow = oa.responses.create(model=MODEL, input="And again", previous_response_id=r.id, max_output_tokens=4)
    assert follow.previous_response_id == r.id
    assert follow.usage.input_tokens > r.usage.input_tokens


@test
def responses_with_function_calls_in_input():
    r = oa.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_9", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_9", "output": "18C"},
        ],
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER_OA["function"]["parameters"]}],
        max_output_tokens=8,
    )
    assert r.status in ("completed", "incomplete")
    for item in r.output:
        if item.type == "function_call":
            json.loads(item.arguments)
            assert item.call_id


@test
def responses_stream():
    types = []
    final = None
    with oa.responses.stream(model=MODEL, input="Stream please", max_output_tokens=10) as stream:
        for event in stream:
            types.append(event.type)
            if event.type in ("response.completed", "response.incomplete"):
                final = event.response
        if types[-1] == "response.completed":
            # The SDK's accumulator only finishes on `completed`; hitting max_output_tokens
            # ends with `response.incomplete`, as the real API does.
            final = stream.get_final_response()
    assert types[0] == "response.created", types[:3]
    assert types[-1] in ("response.completed", "response.incomplete"), types[-1]
    assert final is not None and final.usage is not None and final.usage.output_tokens <= 10
    raw = oa.responses.create(model=MODEL, input="raw stream", max_output_tokens=5, stream=True)
    seqs = [e.sequence_number for e in raw]
    assert seqs == list(range(len(seqs))), seqs


@test
def messages_create():
    r = an.messages.create(
        model=MODEL,
        max_tokens=8,
        system=[
            {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.0; cch=123;"},
            {"type": "text", "text": "You are helpful.", "cache_control": {"type": "ephemeral"}},
        ],
        messages=[{"role": "user", "content": "Hello"}],
        # SDK 2.x has no sampling arguments any more; the API still takes them.
        extra_body={"temperature": 0.5, "top_k": 20},
    )
    assert r.type == "message" and r.role == "assistant" and r.id.startswith("msg_")
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use", "stop_sequence"), r.stop_reason
    for block in r.content:
        assert block.type in ("text", "thinking", "tool_use"), block.type
    assert r.usage.input_tokens > 0 and r.usage.output_tokens <= 8
    assert r.usage.cache_read_input_tokens is not None


@test
def messages_with_tools_thinking_and_tool_results():
    r = an.messages.create(
        model=MODEL,
        max_tokens=10,
        tools=[WEATHER_AN],
        thinking={"type": "enabled", "budget_tokens": 1024},
        stop_sequences=["\n\n\n"],
        messages=[
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": "I should call the tool.", "signature": "sig"},
                    {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}],
            },
        ],
    )
    for block in r.content:
        if block.type == "tool_use":
            assert isinstance(block.input, dict) and block.id.startswith("toolu_")


@test
def messages_stream():
    with an.messages.stream(
        model=MODEL, max_tokens=12, messages=[{"role": "user", "content": "Stream a reply"}]
    ) as stream:
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert "message_start" in events and events[-1] == "message_stop", events
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use", "stop_sequence")
    assert final.usage.output_tokens <= 12
    raw = an.messages.create(
        model=MODEL, max_tokens=6, messages=[{"role": "user", "content": "raw"}], stream=True, tools=[WEATHER_AN]
    )
    names = [e.type for e in raw]
    assert names[0] == "message_start" and names[-1] == "message_stop", names


@test
def messages_count_tokens():
    plain = an.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "How many tokens?"}])
    tooled = an.messages.count_tokens(
        model=MODEL, messages=[{"role": "user", "content": "How many tokens?"}], tools=[WEATHER_AN], system="Sys"
    )
    assert plain.input_tokens > 0 and tooled.input_tokens > plain.input_tokens


@test
def sdk_error_classes():
    try:
        oa.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        raise AssertionError("expected NotFoundError")
    except openai.NotFoundError as e:
        assert e.status_code == 404
    try:
        oa.chat.completions.create(model=MODEL, messages=[], max_tokens=1)
        raise AssertionError("expected BadRequestError")
    except openai.BadRequestError as e:
        assert e.status_code == 400
    try:
        an.messages.create(model="claude-nothing", max_tokens=4, messages=[{"role": "user", "content": "x"}])
        raise AssertionError("expected NotFoundError")
    except anthropic.NotFoundError as e:
        assert e.status_code == 404
    try:
        an.messages.create(model=MODEL, max_tokens=4, messages=[{"role": "user", "content": "word " * 3000}])
        raise AssertionError("expected BadRequestError")
    except anthropic.BadRequestError as e:
        assert "prompt is too long" in str(e)


def main():
    passed = failed = 0
    for fn in TESTS:
        try:
            fn()
            passed += 1
            print(f"ok   {fn.__name__}", flush=True)
        except Exception:  # noqa: BLE001 - report every failure and go on
            failed += 1
            print(f"FAIL {fn.__name__}", flush=True)
            traceback.print_exc()
    print(f"sdk: {passed} passed, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
