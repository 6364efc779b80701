/* Test driver for the pre-tokenizers: reads records (u32 kind, u32 length,
 * bytes) from stdin and prints, per record, the end offset of every piece
 * cb_pretok_next cuts, on one line. */
#include <stdio.h>
#include <stdlib.h>

#include "pretok.h"

int main(void) {
    uint32_t hdr[2];
    while (fread(hdr, sizeof hdr, 1, stdin) == 1) {
        uint8_t *s = malloc(hdr[1] + 1);
        if (!s || fread(s, 1, hdr[1], stdin) != hdr[1]) return 2;
        for (size_t i = 0; i < hdr[1];) {
            size_t e = cb_pretok_next((int)hdr[0], s, hdr[1], i);
            if (e <= i || e > hdr[1]) {
                printf("NO PROGRESS at %zu\n", i);
                return 3;
            }
            printf("%zu ", e);
            i = e;
        }
        printf("\n");
        free(s);
    }
    return 0;
}
