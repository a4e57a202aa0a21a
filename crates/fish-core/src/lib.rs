//! fish-core: the engine (filled in by the engine work).
