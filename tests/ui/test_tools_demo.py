"""The Chat tab's tools demo pieces that run without a model: the two local functions, the schema box and
the step-by-step rendering."""

from __future__ import annotations

import json

import jsonschema
import pytest

from backend.server.tools_demo import (
    DEMO_TOOLS,
    SAMPLE_SCHEMAS,
    convert_units,
    get_weather,
    schema_constraint,
)
from ui.chat_tab import sampling_params as chat_sampling_params
from ui.structured_panel import demo_markdown


def test_local_functions_answer_within_their_own_schemas():
    weather = get_weather("Paris", "celsius")
    assert weather == get_weather("Paris", "celsius") and weather["unit"] == "celsius"
    assert get_weather("Paris", "fahrenheit")["temperature"] == round(weather["temperature"] * 9 / 5 + 32)
    assert convert_units(3, "km", "mi")["result"] == pytest.approx(1.8641, abs=1e-4)
    assert "cannot convert" in convert_units(1, "km", "kg")["error"]
    for tool in DEMO_TOOLS:
        jsonschema.Draft202012Validator.check_schema(tool.function.parameters)


def test_sample_schemas_are_valid_and_the_box_reports_bad_json():
    for schema in SAMPLE_SCHEMAS.values():
        jsonschema.Draft202012Validator.check_schema(schema)
        assert schema_constraint(json.dumps(schema)).json == schema
    assert schema_constraint("  ") is None
    with pytest.raises(ValueError, match="not valid JSON"):
        schema_constraint("{type: object")


ARGS = '{"city": "Paris"}'


def test_demo_markdown_shows_call_result_and_answer():
    text = demo_markdown([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": ARGS}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"temperature": 18}'},
        {"role": "assistant", "content": "It is 18 degrees."},
    ])  # fmt: skip
    assert 'calls** `get_weather({"city": "Paris"})`' in text
    assert '{"temperature": 18}' in text and "(final answer)**: It is 18 degrees." in text


def test_chat_sampling_controls_carry_the_schema_only_when_enabled():
    schema = json.dumps(SAMPLE_SCHEMAS["order"])
    form = dict(
        temperature=0, top_p=1, top_k=-1, max_tokens=32, seed=-1, stop="", use_schema=True, schema=schema
    )
    assert chat_sampling_params(form).structured_outputs.json == SAMPLE_SCHEMAS["order"]
    assert chat_sampling_params({**form, "use_schema": False}).structured_outputs is None
    with pytest.raises(ValueError, match="not valid JSON"):
        chat_sampling_params({**form, "schema": "{"})
