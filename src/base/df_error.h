/* df_error.h - the error record every fallible call fills.
 *
 * Shared by the lowest layer (util) and the public header (engine.h) so that
 * front ends see the same struct the loader fills.  Expected failures (bad
 * file, I/O error, unsupported model, bad flag) return a nonzero int and fill
 * one of these; bugs abort through CHECK instead.  The first error wins:
 * df_err_set does nothing if code is already set, so a deep failure is not
 * overwritten by the generic message of a caller.
 */
#ifndef DF_ERROR_H
#define DF_ERROR_H

#include <stdint.h>

enum df_err_code {
    DF_OK = 0,
    DF_ERR_IO = 1,       /* open/read/map failed */
    DF_ERR_FORMAT = 2,   /* file contents malformed or inconsistent */
    DF_ERR_UNSUPPORTED = 3,
    DF_ERR_ARG = 4,      /* bad argument from the caller */
    DF_ERR_NOMEM = 5,    /* a budgeted buffer could not be allocated */
    DF_ERR_LIMIT = 6,    /* context or batch limit exceeded */
    DF_ERR_NUMERIC = 7,  /* NaN or infinity in the forward pass (weights or overflow) */
};

typedef struct df_error {
    int code;            /* enum df_err_code; 0 = no error */
    int64_t pos;         /* byte offset in the offending input, or -1 */
    char msg[768];
} df_error;

#endif
