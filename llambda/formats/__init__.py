"""Model file formats (GGUF reader/writer, ...). Import the submodule you need."""
