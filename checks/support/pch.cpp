// Compiles the shared precompiled header that the check and test programs reuse.
