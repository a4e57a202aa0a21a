// The activation of gated feed-forward blocks, shared by span_act.comp (the
// act*mul kernel) and the GATED matvec, so that both compute it alike.
// gelu 0: SiLU (SwiGLU); 1: tanh-approximated GELU (GeGLU).
float gated_act(float g, uint gelu) {
    if (gelu != 0u) {
        const float SQRT_2_OVER_PI = 0.7978846;
        const float COEF_A = 0.044715;
        // tanh saturates long before 10; clamping keeps exp inside it finite.
        float u = clamp(SQRT_2_OVER_PI * g * (1.0 + COEF_A * g * g), -10.0, 10.0);
        return 0.5 * g * (1.0 + tanh(u));
    }
    return g / (1.0 + exp(-g));
}
