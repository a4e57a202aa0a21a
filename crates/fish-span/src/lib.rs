//! fish-span: the GPU backend behind fish-core's backend trait (filled in by the stage-1/2 work).
