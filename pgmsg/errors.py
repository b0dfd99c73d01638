"""``pgmsg.errors``: every exception pgmsg raises, importable as a module
(``from pgmsg.errors import PayloadError``). They live in pgmsg.core.errors; this module *is*
that module (the same object), so ``except pgmsg.errors.X`` and ``isinstance`` agree wherever
an error was raised.
"""

import sys

from pgmsg.core import errors

sys.modules[__name__] = errors
