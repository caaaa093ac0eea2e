/* The C tests' check: counts what passed and what failed, and says where
 * a check failed. Each test's main() reports the counts and fails when
 * anything did. Include after <stdio.h>. */
#ifndef IRPVERBS_TESTS_CHECK_H
#define IRPVERBS_TESTS_CHECK_H

static int passed, failed;

#define CHECK(cond, ...)                                                        \
    do {                                                                        \
        if (cond) {                                                             \
            passed++;                                                           \
        } else {                                                                \
            failed++;                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);                \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
        }                                                                       \
    } while (0)

#endif
