"""llambda: a CPU inference engine for LLMs; readable Python, SIMD C kernels."""
from .errors import (ChatTemplateError, ContextOverflowError, DownloadError, InvalidInputError, LlambdaError,
                     LlambdaWarning, ModelBusyError, ModelClosedError, ModelFormatError, ModelNotFoundError, NativeUnavailableError, TokenizerError,
                     VocabularyMismatchError)

__version__ = "0.1.0"


def load(*args, **kwargs):
    """Load a model: see llambda.api.load."""
    from .api import load as _load
    return _load(*args, **kwargs)


__all__ = ["load", "LlambdaError", "ModelFormatError", "TokenizerError", "ChatTemplateError",
           "ContextOverflowError", "DownloadError", "InvalidInputError", "ModelClosedError", "ModelNotFoundError",
           "NativeUnavailableError", "VocabularyMismatchError", "LlambdaWarning", "__version__"]
