"""The engine under every capability: settings, errors, payloads, named SQL, wake-ups, the
worker loop, the source protocol and batch runner, the supervisor. It imports no capability."""
