"""Every registered op, by family. Importing this package registers them all (registry.get does it on demand)."""

from tessel.compiler.ops import (  # noqa: F401 - imported for their registrations
    collective,
    conv,
    creation,
    index,
    linalg,
    math,
    nn,
    norm,
    reduce,
    shape,
    state,
)
