"""``needle-cy serve``: a local tool-calling endpoint that speaks OpenAI's Chat Completions
and Ollama's chat, so that clients written for those (Home Assistant's Ollama integration,
the OpenAI and Ollama SDKs, agent frameworks) use a Needle model unchanged.

* ``needle_cy.serve.protocol`` reads both conventions into one request and writes the
  answers back (plain Python);
* ``needle_cy.serve.engine`` serves the requests in order on one model and resumes the
  conversations clients resend (plain Python);
* ``needle_cy.serve.app`` is the HTTP side (Starlette + uvicorn: the ``[serve]`` extra).

docs/serve.md shows the set-ups.
"""
