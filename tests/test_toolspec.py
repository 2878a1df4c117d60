"""Tool schema normalisation (spec §8.3): callables, dicts, JSON strings, pydantic."""
import enum
import json
from typing import Annotated, List, Literal, Optional

import pytest

from needle_cy import Field, SchemaError, tool
from needle_cy.toolspec import normalize_tool, normalize_tools, parse_docstring


def test_callable_schema_matches_spec_example():
    @tool
    def set_thermostat(temperature: Annotated[int, Field(ge=10, le=30)]):
        """Set the home thermostat to a target temperature in degrees Celsius.

        Args:
            temperature: Target temperature in degrees Celsius.
        """

    spec = normalize_tool(set_thermostat)
    assert spec.compact_json() == (
        '{"name":"set_thermostat","description":"Set the home thermostat to a target '
        'temperature in degrees Celsius.","parameters":{"type":"object","properties":'
        '{"temperature":{"type":"integer","description":"Target temperature in degrees '
        'Celsius.","minimum":10,"maximum":30}},"required":["temperature"]}}')
    assert spec.function is set_thermostat


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


def test_annotation_table_and_required_rules():
    def f(self, a: str, b: int, c: float, d: bool, e: list, g: dict, h: List[int],
          i: Literal[1, 2], j: Color, k: Optional[int] = None, m: "int | None" = 3,
          n=Field(default=4, ge=0), o: int = Field(le=9), *args, **kwargs):
        pass

    params = normalize_tool(f).parameters
    props = params["properties"]
    assert list(props) == list("abcdeghijkmno")
    assert props["a"] == {"type": "string"}
    assert props["b"] == {"type": "integer"}
    assert props["c"] == {"type": "number"}
    assert props["d"] == {"type": "boolean"}
    assert props["e"] == {"type": "array", "items": {"type": "string"}}
    assert props["g"] == {"type": "object"}
    assert props["h"] == {"type": "array", "items": {"type": "integer"}}
    assert props["i"] == {"type": "integer", "enum": [1, 2]}
    assert props["j"] == {"type": "string", "enum": ["red", "blue"]}
    assert props["k"] == {"type": "integer"}
    assert props["n"] == {"type": "string", "minimum": 0}
    assert props["o"] == {"type": "integer", "maximum": 9}
    # A Field default counts only when the Field has default=; Optional is optional.
    assert params["required"] == ["a", "b", "c", "d", "e", "g", "h", "i", "j", "o"]


def test_field_key_order_and_existing_keys_keep_place():
    def f(x: Annotated[Literal["a", "b"], Field(description="pick", enum=["a"], min_length=1,
                                                   const="a")]):
        """Doc.

        Args:
            x (str): ignored because Field sets description
        """

    prop = normalize_tool(f).parameters["properties"]["x"]
    assert list(prop) == ["type", "enum", "description", "minLength", "const"]
    assert prop["enum"] == ["a"] and prop["description"] == "pick"


def test_docstring_parsing_continuations_and_sections():
    desc, args = parse_docstring("""Turn the light
    on or off.

    Args:
        room (str): The room
            to control.
        on: Whether on.
    Returns:
        nothing: not an argument
    """)
    assert desc == "Turn the light on or off."
    assert args == {"room": "The room to control.", "on": "Whether on."}


def test_tool_decorator_options_and_triggers():
    @tool(name="lights", description="Lights.", triggers=["lamp"])
    def f(room: str):
        return room

    assert list(f._needle_tool) == ["name", "description", "parameters", "triggers"]
    assert f("x") == "x"


def test_dict_and_json_string_forms_and_type_aliases():
    raw = {"name": "t", "parameters": {"type": "object", "properties": {
        "a": {"type": "float"}, "b": {"type": "dict"}, "c": {"type": "tuple", "items": {"type": "int"}},
        "d": {"type": "any"}, "e": {"type": ["str", "null"]}}}}
    spec = normalize_tool(json.dumps(raw))
    props = spec.parameters["properties"]
    assert props == {"a": {"type": "number"}, "b": {"type": "object"},
                     "c": {"type": "array", "items": {"type": "integer"}}, "d": {},
                     "e": {"type": ["string", "null"]}}
    # The user's dict is not mutated.
    assert raw["parameters"]["properties"]["a"] == {"type": "float"}
    # OpenAI-style wrapper.
    wrapped = normalize_tool({"type": "function", "function": {"name": "w", "description": "d"}})
    assert wrapped.name == "w" and wrapped.parameters == {"type": "object", "properties": {}}


def test_grammar_schema_implies_additional_properties_false():
    spec = normalize_tool({"name": "t", "parameters": {"type": "object", "properties": {
        "inner": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "free": {"type": "object"},
        "open": {"type": "object", "properties": {"y": {"type": "string"}},
                 "additionalProperties": True}}}})
    g = spec.grammar_schema()["parameters"]
    assert g["additionalProperties"] is False
    assert g["properties"]["inner"]["additionalProperties"] is False
    assert "additionalProperties" not in g["properties"]["free"]
    assert g["properties"]["open"]["additionalProperties"] is True
    # The prompt view is untouched.
    assert "additionalProperties" not in spec.schema["parameters"]


def test_refs_are_inlined_for_the_grammar():
    spec = normalize_tool({"name": "t", "parameters": {
        "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}},
        "$defs": {"P": {"type": "object", "properties": {"z": {"type": "integer"}}}}}})
    g = spec.grammar_schema()["parameters"]
    assert "$defs" not in g
    assert g["properties"]["p"]["properties"]["z"] == {"type": "integer"}


@pytest.mark.parametrize("bad, fragment", [
    ({"parameters": {}}, "missing or empty 'name'"),
    ({"name": "a b"}, "whitespace"),
    ({"name": "t", "parameters": {"type": "array"}}, "expected 'object'"),
    ({"name": "t", "parameters": {"type": "object", "properties": {"a": {"type": "strng"}}}},
     "parameters/properties/a/type is 'strng'"),
    ({"name": "t", "parameters": {"type": "object", "properties": {"a": {"enum": []}}}}, "non-empty list"),
    ({"name": "t", "parameters": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 5, "maximum": 1}}}}, "greater than"),
    ({"name": "t", "parameters": {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "("}}}}, "not a valid regular expression"),
    ({"name": "t", "parameters": {"type": "object", "properties": {}, "required": ["x"]}},
     "not in properties"),
    ({"name": "t", "parameters": {"type": "object", "properties": {"a": 3}}}, "must be a JSON Schema object"),
    ({"name": "t", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/$defs/Q"}}}},
     "points nowhere"),
])
def test_bad_definitions_raise_schema_error_naming_the_place(bad, fragment):
    with pytest.raises(SchemaError, match=None) as info:
        spec = normalize_tools([bad])[0]
        spec.grammar_schema()
    assert fragment in str(info.value)


def test_bad_inputs_to_normalize_tools():
    with pytest.raises(SchemaError, match="not valid JSON"):
        normalize_tools("[{")
    with pytest.raises(SchemaError, match="already used"):
        normalize_tools([{"name": "a"}, {"name": "a"}])
    with pytest.raises(SchemaError, match="cannot use 3"):
        normalize_tools([3])


def test_pydantic_models_when_installed():
    pydantic = pytest.importorskip("pydantic")

    class Booking(pydantic.BaseModel):
        """A table booking."""
        people: int
        name: str = "guest"

    spec = normalize_tool(Booking)
    assert spec.name == "Booking"
    assert list(spec.schema) == ["name", "parameters", "description"]
    assert spec.schema["description"] == "A table booking."
    assert spec.parameters["required"] == ["people"]
    assert spec.pydantic_model is Booking
