// greedy.cpp MODEL PROMPT [N=32]: llama.cpp greedy decode, prints JSON {prompt_token_ids, greedy_token_ids}
#include "llama.h"
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

int main(int argc, char ** argv) {
    if (argc < 3) { fprintf(stderr, "usage: greedy MODEL PROMPT [N]\n"); return 2; }
    const char * path = argv[1];
    std::string prompt = argv[2];
    int n_gen = argc > 3 ? atoi(argv[3]) : 32;
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    auto mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    if (getenv("NO_REPACK")) mp.use_extra_bufts = false;
    llama_model * model = llama_model_load_from_file(path, mp);
    if (!model) { fprintf(stderr, "load failed\n"); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    std::vector<llama_token> toks(prompt.size() + 16);
    int n = llama_tokenize(vocab, prompt.c_str(), prompt.size(), toks.data(), toks.size(), true, true);
    if (n < 0) { fprintf(stderr, "tokenize failed\n"); return 1; }
    toks.resize(n);
    auto cp = llama_context_default_params();
    cp.n_ctx = 512; cp.n_batch = 512; cp.n_ubatch = 512;
    cp.n_threads = 2; cp.n_threads_batch = 2;
    llama_context * ctx = llama_init_from_model(model, cp);
    if (llama_decode(ctx, llama_batch_get_one(toks.data(), toks.size()))) { fprintf(stderr, "decode failed\n"); return 1; }
    int nv = llama_vocab_n_tokens(vocab);
    std::vector<llama_token> out;
    for (int i = 0; i < n_gen; i++) {
        const float * lg = llama_get_logits_ith(ctx, -1);
        llama_token best = 0;
        for (int j = 1; j < nv; j++) if (lg[j] > lg[best]) best = j;
        out.push_back(best);
        if (llama_vocab_is_eog(vocab, best) || (int) out.size() == n_gen) break;
        if (llama_decode(ctx, llama_batch_get_one(&best, 1))) { fprintf(stderr, "decode failed\n"); return 1; }
    }
    printf("{\"prompt_token_ids\": [");
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", toks[i]);
    printf("], \"greedy_token_ids\": [");
    for (size_t i = 0; i < out.size(); i++) printf(i ? ", %d" : "%d", out[i]);
    printf("]}\n");
    llama_free(ctx); llama_model_free(model);
    return 0;
}
