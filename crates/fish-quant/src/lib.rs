//! fish-quant: CPU block formats (filled in by the quantisation work).
