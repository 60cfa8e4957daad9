"""The package's version, in a module of its own: modules that record it in their outputs
import it from here, not from the package, whose ``__init__`` also serves the notebook API."""

__version__ = "0.1.0"
