"""Tool schema normalisation (spec §8.3): callables, dicts, JSON strings, pydantic."""
import enum
import json
import re
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


# ------------------------------------------------------------- misspelt keywords

def _volume(level_schema, **extra):
    return {"name": "set_volume", "description": "Set the speaker volume.",
            "parameters": {"type": "object", "properties": {"level": level_schema}}, **extra}


def test_misspelt_keyword_names_the_keyword_it_looks_like():
    from needle_cy.grammar.keywords import misspelt_keyword
    for typo, meant in [("maximun", "maximum"), ("minLenght", "minLength"), ("max_length", "maxLength"),
                        ("additionalProperty", "additionalProperties"), ("Type", "type"),
                        ("requried", "required"), ("enums", "enum"), ("exclusiveMaximun", "exclusiveMaximum"),
                        ("oneof", "oneOf"), ("patern", "pattern"), ("ref", "$ref")]:
        assert misspelt_keyword(typo) == meant, typo
    assert misspelt_keyword("maximun", 10) == "maximum" and misspelt_keyword("type:", "string") == "type"
    # known keywords, annotations, common vendor keys, keys switched off with a prefix and
    # values of another shape than the keyword takes are not typos
    for name in ("maximum", "title", "examples", "nullable", "discriminator", "x-order", "units",
                 "readOnly", "deprecated", "tags", "id", "$comment", "order", "_format", "@type",
                 "__ref", "note"):
        assert misspelt_keyword(name) is None, name
    assert misspelt_keyword("form", [{"type": "validator"}]) is None         # a UI layout, not format
    assert misspelt_keyword("maximun", "ten") is None


def test_a_misspelt_keyword_warns_naming_tool_and_path_and_strict_raises():
    from needle_cy import SchemaWarning
    tool_def = _volume({"type": "integer", "minimum": 0, "maximun": 10})
    with pytest.warns(SchemaWarning) as caught:
        spec = normalize_tools([tool_def])[0]
    assert len(caught) == 1
    text = str(caught[0].message)
    assert "tool 'set_volume': parameters/properties/level has the key 'maximun'" in text
    assert "did you mean 'maximum'?" in text and "strict=True" in text
    assert caught[0].filename == __file__           # points at the caller, not at needle_cy
    assert spec.parameters["properties"]["level"]["maximun"] == 10      # kept as written
    with pytest.raises(SchemaError, match=r"tools\[0\]: tool 'set_volume': parameters/properties/level "
                                          r"has the key 'maximun'.*did you mean 'maximum'\?.*correct the spelling"):
        normalize_tools([tool_def], strict=True)
    with pytest.raises(SchemaError, match="maximun"):
        normalize_tool(tool_def, strict=True)


def test_misspelt_keywords_are_found_in_every_subschema_and_only_there(recwarn):
    from needle_cy import SchemaWarning
    params = {"type": "object",
              "properties": {
                  "maximun": {"type": "integer"},                          # a property named so: fine
                  "tags": {"type": "array", "items": {"type": "string", "maxLenght": 5}},
                  "mode": {"anyOf": [{"type": "string"}, {"type": "integer", "minimun": 1}]},
                  "note": {"type": "string", "default": {"maximun": 1}, "enum": [{"Type": 1}, "x"],
                           "examples": [{"requried": 1}]},              # data, not schemas
                  "ref": {"$ref": "#/$defs/level"}},
              "$defs": {"level": {"type": "number", "multipleof": 0.5}},
              "requried": ["tags"]}
    normalize_tool({"name": "mixer", "parameters": params})
    found = sorted(re.match(r"tool 'mixer': (\S+) has the key '(\w+)'", str(w.message)).groups()
                   for w in recwarn.list if issubclass(w.category, SchemaWarning))
    assert found == [("parameters", "requried"), ("parameters/$defs/level", "multipleof"),
                     ("parameters/properties/mode/anyOf/1", "minimun"),
                     ("parameters/properties/tags/items", "maxLenght")]


def test_a_misspelt_tool_key_warns(recwarn):
    from needle_cy import SchemaWarning
    normalize_tool({"name": "a", "descripton": "x", "parameter": {"type": "object"}})
    normalize_tool({"name": "b", "params": {"type": "object", "properties": {"x": {"type": "string"}}}})
    messages = [str(w.message) for w in recwarn.list if issubclass(w.category, SchemaWarning)]
    assert any("tool 'a': the tool definition has the key 'parameter'" in m and "'parameters'" in m
               for m in messages)
    assert any("tool 'a'" in m and "'descripton'" in m and "'description'" in m for m in messages)
    assert any("tool 'b'" in m and "'params'" in m and "'parameters'" in m for m in messages)


def test_well_formed_tools_do_not_warn(recwarn):
    from needle_cy import home_tools
    normalize_tools(home_tools(), strict=True)
    normalize_tool(_volume({"type": "integer", "minimum": 0, "maximum": 10, "title": "Level",
                            "x-unit": "percent", "nullable": False}), strict=True)
    assert not recwarn.list


def test_home_tools_is_the_embedded_catalogue_a_fresh_copy_each_call(monkeypatch, tmp_path):
    import needle_cy
    from needle_cy import ModelNotAvailableError, toolspec
    tools = needle_cy.home_tools()
    assert len(tools) == 20 and tools[0]["name"] == "set_light"
    assert {"lock_door", "set_thermostat", "add_to_shopping_list"} <= {t["name"] for t in tools}
    tools[0]["name"] = "changed"
    assert needle_cy.home_tools()[0]["name"] == "set_light"
    monkeypatch.setattr(toolspec, "HOME_TOOLS_PATH", tmp_path / "absent.json")
    with pytest.raises(ModelNotAvailableError, match="not installed.*pass your own tools="):
        needle_cy.home_tools()
