"""The string formats the grammar enforces, each as a regex with its exact rule written beside it.

``EXACT_FORMATS`` are exactly their format, so their complement (``not``) is exact too; the
``NARROWED_FORMATS`` refuse some valid values (see each rule), so a ``not``, an ``if`` or an
overlapping ``oneOf`` over them is refused.  ``UNENFORCED_STANDARD_FORMATS`` raise
``UnsupportedSchemaError``; any other format name is an annotation."""
from __future__ import annotations

ENFORCED_FORMATS = {"email", "uuid", "date", "time", "date-time", "ipv4", "uri"}
# Formats whose automaton is exactly the format (``FORMAT_REGEX`` documents each rule): their
# complement is exact too.  The others are narrowed -- they refuse some valid values (leap
# seconds, more than 9 fraction digits, quoted or IP-literal emails, and a uri rule that is
# only character-level) -- so a `not`, an `if` or an overlapping `oneOf` over them is refused:
# a narrowed complement would accept values the format allows.
EXACT_FORMATS = {"date", "uuid", "ipv4"}
NARROWED_FORMATS = ENFORCED_FORMATS - EXACT_FORMATS
UNENFORCED_STANDARD_FORMATS = {
    "ipv6", "hostname", "idn-hostname", "idn-email", "iri", "iri-reference", "uri-reference",
    "uri-template", "json-pointer", "relative-json-pointer", "regex", "duration",
}


def draft_format(name, draft):
    """The format ``name`` asks for in a schema of ``draft`` (3, 4, 6, 7, 2019, 2020):
    draft 3's "ip-address" is "ipv4"; other names are themselves."""
    return "ipv4" if draft <= 3 and name == "ip-address" else name


def format_defined(name, draft):
    """False where ``draft`` does not define the (enforced) format ``name``, so that it is
    an annotation there by the letter of the draft: "date" and "time" are formats of
    draft 3 and of 7 onwards but not of 4 and 6, "uuid" only from 2019-09, "ipv4" is not
    a draft-3 name.  The grammar still enforces such a format where it is asked for
    (stricter than an annotation, so nothing invalid either way, and what the MaskBench
    labels expect), but its ``not`` holds nothing: only then do both readings agree."""
    if name in ("date", "time"):
        return draft not in (4, 6)
    if name == "uuid":
        return draft >= 2019
    if name == "ipv4":
        return draft > 3
    return True


# ----------------------------------------------------------------------------
# formats as regexes (exact rules, documented)
_YEAR = r"(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"       # 0001-9999
_LEAP2 = r"(?:[02468][48]|[13579][26]|[2468]0)"                       # 04..96 by 4, not 00
_LEAP_YEAR = r"(?:[0-9]{2}" + _LEAP2 + "|" + _LEAP2 + "00)"            # Gregorian leap years
_DATE = (r"(?:" + _YEAR + r"-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
         r"|02-(?:0[1-9]|1[0-9]|2[0-8]))|" + _LEAP_YEAR + "-02-29)")
_TIME = (r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,9})?"
         r"(?:[zZ]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
FORMAT_REGEX = {
    # RFC 3339 full-date, proleptic Gregorian, years 0001-9999 (as Python's date): month
    # lengths and leap years (29 February of 2024 and 2000, not of 1900) -- exact.
    "date": "^" + _DATE + "$",
    # RFC 3339 full-time with a mandatory offset; no leap second, at most 9 fraction digits
    # (narrowed).
    "time": "^" + _TIME + "$",
    "date-time": "^" + _DATE + "[tT]" + _TIME + "$",
    # dotted quad, no leading zeros -- exact
    "ipv4": "^" + _OCTET + r"(?:\." + _OCTET + "){3}$",
    # 8-4-4-4-12 hex digits -- exact
    "uuid": r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    # local@domain: ASCII atext dot-atoms, domain labels of letters/digits/hyphens (not at ends);
    # no quoted local part, no IP literal (narrowed)
    "email": r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
             r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$",
    # absolute URI: scheme ":" then RFC 3986 characters (unreserved, reserved, %HH); a
    # character-level rule, not the RFC's grammar
    "uri": r"^[A-Za-z][A-Za-z0-9+.-]*:(?:[A-Za-z0-9\-._~!$&'()*+,;=:@/?#\[\]]|%[0-9A-Fa-f]{2})*$",
}

