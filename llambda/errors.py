"""Typed exceptions: every bad input ends in one of these, never a crash."""


class LlambdaError(Exception):
    """Base class of all llambda errors."""


class ModelFormatError(LlambdaError, ValueError):
    """A model file (GGUF, safetensors, config.json) is malformed or unsupported; also raised when a
    loaded model's forward pass gives non-finite logits (corrupt weights)."""


class AdapterError(ModelFormatError):
    """A LoRA adapter cannot be applied: malformed, of a kind not supported (DoRA, another PEFT type),
    or made for another model (architecture, tensor names or shapes)."""


class TokenizerError(LlambdaError, ValueError):
    """The tokenizer cannot be built or cannot encode/decode the input."""


class ChatTemplateError(LlambdaError, ValueError):
    """A chat template is missing, broken, or tried something unsafe."""


class ContextOverflowError(LlambdaError, ValueError):
    """A prompt (plus generation) does not fit in the context window."""


class InvalidInputError(LlambdaError, ValueError):
    """An argument of a library call is of the wrong type or out of range (e.g. a token id)."""


class ImageDataError(InvalidInputError):
    """An image sent as text (base64) cannot be taken: not a string, empty, not base64, or larger than an
    image may be. `code` names the refusal for an API's error object ("invalid_base64", "image_too_large",
    None for the others)."""

    def __init__(self, message: str, code: str | None = None):
        super().__init__(message)
        self.code = code


class VocabularyMismatchError(LlambdaError, ValueError):
    """A draft model's vocabulary is not the target's: its token ids would mean other text."""


class ModelBusyError(LlambdaError, RuntimeError):
    """A library call would compute on a model a running server scheduler owns: its forward passes and
    KV-cache slots are the scheduler's (send the request to the server, or load the model again)."""


class ModelNotFoundError(LlambdaError, FileNotFoundError):
    """A model name is neither a catalogued model nor an existing file or directory."""


class DownloadError(LlambdaError, OSError):
    """Fetching or verifying a catalogued model failed."""


class LlambdaWarning(UserWarning):
    """Something works but not as the user probably expects (a context beyond training, too many threads)."""


class NativeUnavailableError(LlambdaError, RuntimeError):
    """The C core was not built or cannot run on this CPU."""


class InsufficientMemoryError(LlambdaError, MemoryError):
    """The memory plan of a load (weights + KV cache) is more than the machine has available: refused
    before any weight is read (a smaller context, an f16 KV cache or a smaller quantization fits less)."""


class ModelClosedError(LlambdaError, RuntimeError):
    """A call on a model after its close(): its weights and caches were freed."""
