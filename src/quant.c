/* quant.c - format tables and the activation reorder for MXFP4 (see quant.h). */
#include "quant.h"
#include <math.h>

const float e2m1_table[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

float e8m0_table[256];

void quant_init(void)
{
    for (int s = 0; s < 255; s++) e8m0_table[s] = ldexpf(1.0f, s - 127);
    e8m0_table[255] = NAN;
}

void mxfp4_prep_x(const float *x, int C, float *xp)
{
    for (int b = 0; b < C; b += MXFP4_BLOCK)
        for (int j = 0; j < 16; j++) {
            xp[b + j] = x[b + 2 * j];
            xp[b + 16 + j] = x[b + 2 * j + 1];
        }
}
