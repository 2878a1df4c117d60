"""Shared by the grammar tests: random, mostly-valid byte streams for a grammar."""


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
