"""``smollm2-agent:135m``: the real SmolLM2-135M weights with a chat template that renders tools (Qwen
2.5's ``<tool_call>`` format, whose tokens SmolLM2 shares) and thinks when asked (a ``<think>`` generation
prompt when ``enable_thinking`` is true, as Qwen 3 templates do). SmolLM2's own template knows neither,
so its GGUF shows only the ``completion`` capability and llama-server ignores tools and thinking for it;
this copy lets the conformance suite prove tool_use/tool_result round trips and thinking blocks against
a real llama-server and real generation. Its capabilities are ``completion``, ``tools``, ``thinking``.
"""

from __future__ import annotations

from pathlib import Path

AGENT_NAME = "smollm2-agent:135m"

AGENT_TEMPLATE = (
    '{%- if tools %}\n'
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    '    {%- else %}\n'
    "        {{- 'You are a helpful assistant.' }}\n"
    '    {%- endif %}\n'
    '    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the us'
    'er query.\\n\\nYou are provided with function signatures within <tools></tools> XM'
    'L tags:\\n<tools>" }}\n'
    '    {%- for tool in tools %}\n'
    '        {{- "\\n" }}\n'
    '        {{- tool | tojson }}\n'
    '    {%- endfor %}\n'
    '    {{- "\\n</tools>\\n\\nFor each function call, return a json object with functio'
    'n name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"n'
    'ame\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end'
    '|>\\n" }}\n'
    '{%- else %}\n'
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    '    {%- else %}\n'
    "        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}\n'
    '{%- for message in messages %}\n'
    '    {%- if (message.role == "user") or (message.role == "system" and not loop.fi'
    'rst) %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>"
    "' + '\\n' }}\n"
    '    {%- elif message.role == "assistant" %}\n'
    "        {{- '<|im_start|>' + message.role + '\\n' }}\n"
    '        {%- if message.reasoning_content %}\n'
    "            {{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}\n"
    '        {%- endif %}\n'
    '        {%- if message.content %}\n'
    '            {{- message.content }}\n'
    '        {%- endif %}\n'
    '        {%- if message.tool_calls %}\n'
    '            {%- for tool_call in message.tool_calls %}\n'
    '                {%- if tool_call.function is defined %}\n'
    '                    {%- set tool_call = tool_call.function %}\n'
    '                {%- endif %}\n'
    '                {{- \'<tool_call>\\n{"name": "\' }}\n'
    '                {{- tool_call.name }}\n'
    '                {{- \'", "arguments": \' }}\n'
    '                {{- tool_call.arguments | tojson }}\n'
    "                {{- '}\\n</tool_call>\\n' }}\n"
    '            {%- endfor %}\n'
    '        {%- endif %}\n'
    "        {{- '<|im_end|>\\n' }}\n"
    '    {%- elif message.role == "tool" %}\n'
    '        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") '
    '%}\n'
    "            {{- '<|im_start|>user' }}\n"
    '        {%- endif %}\n'
    "        {{- '\\n<tool_response>\\n' }}\n"
    '        {{- message.content }}\n'
    "        {{- '\\n</tool_response>' }}\n"
    '        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n'
    "            {{- '<|im_end|>\\n' }}\n"
    '        {%- endif %}\n'
    '    {%- endif %}\n'
    '{%- endfor %}\n'
    '{%- if add_generation_prompt %}\n'
    "    {{- '<|im_start|>assistant\\n' }}\n"
    '    {%- if enable_thinking is defined and enable_thinking %}\n'
    "        {{- '<think>\\n' }}\n"
    '    {%- endif %}\n'
    '{%- endif %}\n'
)


def write_agent_model(source: Path, target: Path) -> Path:
    """Copy the GGUF ``source`` to ``target`` with :data:`AGENT_TEMPLATE` as its chat template."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(source))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    assert arch is not None
    writer = gguf.GGUFWriter(str(target), arch=str(arch.contents()), endianess=reader.endianess)
    template = MetadataDetails(gguf.GGUFValueType.STRING, AGENT_TEMPLATE)
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: template}, [])
    return target
