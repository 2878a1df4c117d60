"""The string formats the grammar enforces, each as a regex with its exact rule written beside it.

``EXACT_FORMATS`` are exactly their format, so their complement (``not``) is exact too; the
``NARROWED_FORMATS`` refuse some valid values (see each rule), so a ``not``, an ``if`` or an
overlapping ``oneOf`` over them is refused.  ``UNENFORCED_STANDARD_FORMATS`` raise
``UnsupportedSchemaError``; any other format name is an annotation."""
from __future__ import annotations

ENFORCED_FORMATS = {"email", "uuid", "date", "time", "date-time", "ipv4", "uri", "hostname", "idn-hostname",
                    "ipv6", "idn-email", "uri-reference", "iri", "iri-reference", "uri-template",
                    "json-pointer", "relative-json-pointer", "duration", "regex"}
# Formats whose automaton is exactly the format (``FORMAT_REGEX`` documents each rule): their
# complement is exact too.  The others are narrowed -- they refuse some valid values (leap
# seconds, more than 9 fraction digits, quoted or IP-literal emails, and a uri rule that is
# only character-level) -- so a `not`, an `if` or an overlapping `oneOf` over them is refused:
# a narrowed complement would accept values the format allows.
EXACT_FORMATS = {"date", "uuid", "ipv4", "json-pointer"}
NARROWED_FORMATS = ENFORCED_FORMATS - EXACT_FORMATS
UNENFORCED_STANDARD_FORMATS = set()
# Formats whose rule needs a length bound beside its automaton (code points = bytes: ASCII
# rules): the string node takes it as a maxLength; where only an automaton can hold the rule
# (propertyNames) the format is refused.
FORMAT_MAX_LENGTH = {"hostname": 253, "idn-hostname": 253}


def draft_format(name, draft):
    """The format ``name`` asks for in a schema of ``draft`` (3, 4, 6, 7, 2019, 2020):
    draft 3's "ip-address" is "ipv4", its "host-name" "hostname"; other names are themselves."""
    if draft <= 3:
        return {"ip-address": "ipv4", "host-name": "hostname"}.get(name, name)
    return name


# draft 3's "time" is hh:mm:ss (jsonschema: datetime.strptime "%H:%M:%S": one or two digits
# each, hours to 23, seconds to 59) -- not RFC 3339's full-time, which needs an offset.
# Narrowed: ASCII digits only (strptime's \d also takes a Unicode digit, "0:\u0661:0")
DRAFT3_TIME_REGEX = r"^(?:2[0-3]|[01][0-9]|[0-9]):(?:[0-5][0-9]|[0-9]):(?:[0-5][0-9]|[0-9])$"


def format_regex(name, draft):
    """The regex of the enforced format ``name`` (a ``draft_format`` name) in ``draft``."""
    if name == "time" and draft <= 3:
        return DRAFT3_TIME_REGEX
    return FORMAT_REGEX[name]


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
    if name in ("uri-reference", "uri-template", "json-pointer"):
        return draft >= 6
    if name in ("relative-json-pointer", "idn-email", "idn-hostname", "iri", "iri-reference"):
        return draft >= 7
    if name == "duration":
        return draft >= 2019
    if name == "hostname":
        return draft > 3      # draft 3 calls it "host-name"
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
_H16 = r"[0-9a-fA-F]{1,4}"
# IPv6 text forms (RFC 4291 2.2): eight groups, or "::" standing for one or more zero groups
_IPV6 = "(?:" + "|".join(
    [r"(?:" + _H16 + r":){7}" + _H16]
    + [r"(?:(?:" + _H16 + r":){0,%d}" % (k - 1) + _H16 + r")?::" + (r"(?:" + _H16 + r":){0,%d}" % (6 - k) + _H16
       if k < 7 else "") for k in range(1, 8)]
    + [r"::(?:(?:" + _H16 + r":){0,6}" + _H16 + r")?"]) + ")"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_TOP_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_IDN_LABEL = r"[a-z0-9](?:-?[a-z0-9]){0,31}"
# RFC 3986 pieces, ASCII: a path character, a segment without ":" (first of a relative path)
_PCT = r"%[0-9A-Fa-f]{2}"
_PCHAR = r"(?:[A-Za-z0-9\-._~!$&'()*+,;=:@]|" + _PCT + ")"
_SEG = _PCHAR + "*"
_SEG_NZ = _PCHAR + "+"
_AUTHORITY = (r"(?:(?:[A-Za-z0-9\-._~!$&'()*+,;=:]|" + _PCT + r")*@)?(?:[A-Za-z0-9\-._~!$&'()*+,;=]|" + _PCT
              + r")*(?::[0-9]*)?")
_QF = r"(?:\?(?:" + _PCHAR + r"|[/?])*)?(?:#(?:" + _PCHAR + r"|[/?])*)?"
_ABS_URI = (r"[A-Za-z][A-Za-z0-9+.-]*:(?://" + _AUTHORITY + "(?:/" + _SEG + ")*|/(?:" + _SEG_NZ + "(?:/" + _SEG
            + ")*)?|" + _SEG_NZ + "(?:/" + _SEG + ")*|)" + _QF)
_REL_REF = (r"(?://" + _AUTHORITY + "(?:/" + _SEG + ")*|/(?:" + _SEG_NZ + "(?:/" + _SEG + r")*)?|\.\.?(?:/" + _SEG
            + ")*)" + _QF + r"|\?(?:" + _PCHAR + r"|[/?])*(?:#(?:" + _PCHAR + r"|[/?])*)?|#(?:" + _PCHAR + r"|[/?])*")
_JSON_POINTER = r"(?:/(?:[^~/]|~[01])*)*"
# ISO 8601 durations as RFC 3339 appendix A writes them
_DUR_TIME = r"T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
_DUR_DATE = r"(?:[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)(?:" + _DUR_TIME + ")?"
# regexes both engines compile (ECMA-262 with u, Python re): literals, escapes, classes, groups
# nested at most twice, one quantifier per atom, {n,m} with n <= m
_RX_LIT = r"[^\\^$.|?*+()\[\]{}\x00-\x1f]"
_RX_ESC = r"\\[dDwWsSbB.\\/^$|?*+()\[\]{}nrtf]"
_RX_RANGE = "(?:a-z|A-Z|0-9|a-f|A-F|1-9)"     # ranges whose ends are in order
_RX_CLASS = (r"\[\^?(?:" + _RX_RANGE + r"|[A-Za-z0-9_ .,:;@#%&='\"!~<>/+*?(){}|$]|\\[dDwWsS.\\\]\[nrt^\-])+\]")
_RX_QUANT = (r"(?:[*+?]|\{[0-9]+\}|\{[0-9]+,\}|\{0,[0-9]+\}|\{[0-9],[1-9][0-9]+\}|\{[1-9][0-9],[1-9][0-9]{2,}\}|"
             + "|".join(r"\{%d,%d\}" % (a, b) for a in range(10) for b in range(max(a, 1), 10)) + r")\??")


def _rx_level(inner):
    atom = r"(?:" + _RX_LIT + "|" + _RX_ESC + "|" + _RX_CLASS + r"|\." + ("" if inner is None else r"|\((?:\?:)?" + inner + r"\)") + ")"
    seq = r"(?:" + atom + "(?:" + _RX_QUANT + r")?|\^|\$)*"
    return seq + r"(?:\|" + seq + ")*"
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
    # RFC 1123 host names: dot-separated labels of 1-63 letters, digits and hyphens (not at
    # a label's ends), the last starting with a letter, 253 characters at most
    # (FORMAT_MAX_LENGTH); no trailing dot, no underscore (narrowed)
    "hostname": "^(?:" + _LABEL + r"\.)*" + _TOP_LABEL + "$",
    # IDNA: ASCII lowercase labels without a double hyphen (narrowed: no U-labels, labels
    # of at most 32 letters/digits)
    "idn-hostname": "^" + _IDN_LABEL + r"(?:\." + _IDN_LABEL + ")*$",
    # RFC 4291 text forms without a zone or an embedded IPv4 (narrowed)
    "ipv6": "^" + _IPV6 + "$",
    # the ASCII email rule (narrowed)
    "idn-email": r"^[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*"
                 r"@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*$",
    # RFC 3986 absolute URIs (no IP-literal host), or relative references that start with
    # "/", "./", "../", "?" or "#" (narrowed: no bare relative path such as "a/b", no "")
    "uri-reference": "^(?:" + _ABS_URI + "|" + _REL_REF + ")$",
    "iri": "^" + _ABS_URI + "$",
    "iri-reference": "^(?:" + _ABS_URI + "|" + _REL_REF + ")$",
    # RFC 6570 literals and expressions {op? var(:prefix|*)?(,...)*} (ASCII, narrowed)
    "uri-template": r"^(?:[!#$&()*+,\-./0-9:;=?@A-Z\[\]_a-z~]|" + _PCT + r"|\{[+#./;?&]?"
                    r"[A-Za-z0-9_](?:\.?[A-Za-z0-9_])*(?::[1-9][0-9]{0,3}|\*)?"
                    r"(?:,[A-Za-z0-9_](?:\.?[A-Za-z0-9_])*(?::[1-9][0-9]{0,3}|\*)?)*\})*$",
    # RFC 6901 -- exact
    "json-pointer": "^" + _JSON_POINTER + "$",
    # a non-negative integer (zeros only as its last digit: narrowed), then "#" or a
    # non-empty JSON pointer
    "relative-json-pointer": r"^(?:0|[1-9][1-9]*0?)(?:#|(?:/(?:[^~/]|~[01])*)+)$",
    "duration": "^P(?:" + _DUR_DATE + "|" + _DUR_TIME + "|[0-9]+W)$",
    "regex": "^" + _rx_level(_rx_level(_rx_level(None))) + "$",
}

