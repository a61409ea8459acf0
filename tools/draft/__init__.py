"""Training tooling for Specula's EAGLE-style draft head (issue 13). Python is tooling only: the
runtime reads the exported GGUF from C++. See docs/draft.md."""
