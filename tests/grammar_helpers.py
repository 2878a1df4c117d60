"""Shared by the grammar tests and the fuzz harness: random, mostly-valid byte streams for a
grammar, and the jsonschema validator class the grammar is judged by."""
from decimal import Decimal


def random_walk(rng, grammar, alphabet=range(256), max_len=160, noise=0.1):
    """Extend with a random byte from ``alphabet`` that the state accepts, sometimes (with
    probability ``noise``) with any byte; stop at a refused byte or a dead end."""
    s = grammar.start()
    out = bytearray()
    for _ in range(max_len):
        if rng.random() < noise:
            b = rng.randrange(256)
        else:
            cands = [b for b in alphabet if s.clone().feed(bytes([b]))]
            if not cands:
                break
            b = rng.choice(cands)
        out.append(b)
        if not s.feed(bytes([b])):
            break
    return bytes(out)


def _is_integral(checker, x):
    """Draft 6 on: an integer is any number with an integral value, a Decimal too (jsonschema's
    own checker knows int and float only: Decimal('1.0') would not be an integer, and a
    grammar that reads 1.0 as the draft does would look wrong)."""
    if isinstance(x, bool):
        return False
    if isinstance(x, int):
        return True
    if isinstance(x, float):
        return x.is_integer()
    if isinstance(x, Decimal):
        return x.is_finite() and (x.as_tuple().exponent >= 0 or x == x.to_integral_value())
    return False


def oracle_validator_class(schema):
    """The jsonschema validator class of ``schema``'s draft (2020-12 by default), reading
    integer as the draft does from draft 6 on (``_is_integral``)."""
    import jsonschema
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    if cls not in (jsonschema.Draft3Validator, jsonschema.Draft4Validator):
        cls = jsonschema.validators.extend(cls, type_checker=cls.TYPE_CHECKER.redefine("integer", _is_integral))
    return cls
