/* The model's dimensions as compile-time constants, for the kernels whose
 * loops run over them. A specialised build's build_config.h defines
 * CB_SPEC_HEAD_DIM, CB_SPEC_EXPERTS, CB_SPEC_TOP_K, CB_SPEC_HIDDEN and
 * CB_SPEC_EXPERT_FFN; the generic build leaves them undefined (0 here, which
 * no size matches, so its objects are what they were without this header).
 *
 * CB_WITH_SPEC(v, C, stmt): where the size v equals the constant C, stmt runs
 * with v shadowed by the literal C (a second copy of an inlined kernel body,
 * loops of constant trip count), else with v as is. The same operations in
 * the same order either way, so the same bits; any other model still runs,
 * through the generic copy. */
#ifndef CB_KERNELS_SPEC_H
#define CB_KERNELS_SPEC_H

#include "build_config.h"

#ifndef CB_SPEC_HEAD_DIM
#define CB_SPEC_HEAD_DIM 0
#endif
#ifndef CB_SPEC_EXPERTS
#define CB_SPEC_EXPERTS 0
#endif
#ifndef CB_SPEC_TOP_K
#define CB_SPEC_TOP_K 0
#endif
#ifndef CB_SPEC_HIDDEN
#define CB_SPEC_HIDDEN 0
#endif
#ifndef CB_SPEC_EXPERT_FFN
#define CB_SPEC_EXPERT_FFN 0
#endif

#define CB_SPEC_IS(v, C) ((C) > 0 && (v) == (C))
#define CB_WITH_SPEC(v, C, stmt)                                                                                    \
    do {                                                                                                            \
        if (CB_SPEC_IS(v, C)) {                                                                                     \
            const int v = (C);                                                                                      \
            stmt;                                                                                                   \
        } else {                                                                                                    \
            stmt;                                                                                                   \
        }                                                                                                           \
    } while (0)

#endif
