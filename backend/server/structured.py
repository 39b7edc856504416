"""Structured-output request fields: OpenAI's ``response_format`` and vLLM's ``structured_outputs``.

``structured_outputs`` is the engine's StructuredOutputsParams itself (pydantic validates the dataclass);
``response_format`` becomes one. A request may use one of them, not both.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from backend.engine.sampling_params import StructuredOutputsParams
from backend.server.errors import OpenAIError


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's response_format: text (no constraint), json_object, or json_schema."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


def structured_outputs_params(
    response_format: ResponseFormat | None, structured: StructuredOutputsParams | None
) -> StructuredOutputsParams | None:
    """The engine's constraint for these request fields; OpenAIError 400 when they are malformed."""
    if response_format is not None and response_format.type != "text" and structured is not None:
        raise OpenAIError(
            400,
            "Use either response_format or structured_outputs, not both",
            param="structured_outputs",
        )
    if structured is not None:  # validated by the dataclass itself when the body was parsed
        return structured
    if response_format is None or response_format.type == "text":
        return None
    if response_format.type == "json_object":
        return StructuredOutputsParams(json_object=True)
    if response_format.json_schema is None or response_format.json_schema.json_schema is None:
        raise OpenAIError(
            400,
            'response_format of type "json_schema" needs json_schema.schema (a JSON schema object)',
            param="response_format",
        )
    return StructuredOutputsParams(json=response_format.json_schema.json_schema)
