// fox/docmask.h: document masking (--doc-mask, docs/model.md §1.8), the one definition both trainers,
// their kernels and ACP use. A separator token (--doc-sep, <|endoftext|> by default) starts a document:
// it belongs to the document it precedes, as in llm.c's shards, where every document is written after
// one. The forget gate is closed at a separator: its log f is FOX_DOC_LOG_F whatever the gate computes,
// so every bias c_i - c_j across it is at most FOX_DOC_LOG_F and those weights vanish from the softmax;
// with no learned gate (the Transformer presets) log f is 0 elsewhere and c holds the boundary terms
// alone. KV-shift does not reach back across a separator (the key before it counts as 0, as at t = 0).
// With ACP a query block skips every key block before the document of its first row: those tiles are
// dead by construction, so no threshold test is needed.
#ifndef FOX_DOCMASK_H
#define FOX_DOCMASK_H

#include <stddef.h>  // size_t
#include "acp.h"     // FOX_ACP_BLOCK, fox_acp_blocks: the tile grid

// log f at a separator. e^(2U + FOX_DOC_LOG_F) is below fp32's smallest normal for every score bound U <
// 200 (docs/model.md §1.8: larger values cost precision in the fp32 c the GPU keeps).
#define FOX_DOC_LOG_F (-512.0f)

#ifdef __CUDACC__
#define FOX_DOC_HD __host__ __device__
#else
#define FOX_DOC_HD
#endif

// Whether the token starts a document. sep < 0: no document mask (token ids are never negative).
static inline FOX_DOC_HD int fox_doc_start(int token, int sep) { return sep >= 0 && token == sep; }

// log f of a position: the gate's own value (0 without a gate), or FOX_DOC_LOG_F at a separator. In double
// so that the float64 build of the CPU trainer keeps its precision; exact for float arguments.
static inline FOX_DOC_HD double fox_doc_log_f(double log_f, int token, int sep) {
    return fox_doc_start(token, sep) ? (double)FOX_DOC_LOG_F : log_f;
}

// Whether position t (of a sequence whose tokens start at `tokens`) takes KV-shift's previous token.
static inline FOX_DOC_HD int fox_doc_has_prev(const int *tokens, int t, int sep) {
    return t > 0 && !fox_doc_start(tokens[t], sep);
}

// ACP with the document mask (docs/model.md §1.5, §1.8): doc_first[b * nblk + m] is the key block holding
// the start of the document of query block m's first row (the last separator at or before it, else 0);
// every key block before it is dead for the whole query block. B sequences of T tokens; host code.
static inline void fox_doc_first_blocks(int *doc_first, const int *tokens, int B, int T, int sep) {
    int nblk = fox_acp_blocks(T);
    for (int b = 0; b < B; b++) {
        const int *tok = tokens + (size_t)b * T;
        int start = 0, t = 0;
        for (int m = 0; m < nblk; m++) {
            for (; t <= m * FOX_ACP_BLOCK; t++)
                if (fox_doc_start(tok[t], sep)) start = t;
            doc_first[(size_t)b * nblk + m] = start / FOX_ACP_BLOCK;
        }
    }
}

#endif
