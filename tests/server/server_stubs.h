/* server_stubs.h - what server.c's command needs of cli.c, for the C tests
 * that include the server's sources (test_server_emit.c,
 * tests/agents/test_agent_requests.c): never reached there. */
#ifndef DF_TEST_SERVER_STUBS_H
#define DF_TEST_SERVER_STUBS_H

/* cli.c's helpers, which server.c's command uses (not reached here) */
_Noreturn void die(const char *fmt, ...) { (void)fmt; abort(); }
long parse_long(const char *s, const char *flag, long lo, long hi) { (void)flag; (void)lo; (void)hi; return atol(s); }
size_t parse_size(const char *s, const char *flag) { (void)flag; return (size_t)atol(s); }
void parse_common(int argc, char **argv, run_args *a) { (void)argc; (void)argv; memset(a, 0, sizeof *a); }
df_engine *open_engine(const run_args *a) { (void)a; abort(); }
void plan_json(FILE *out, const df_plan *p, int ok, const char *msg) { (void)out, (void)p, (void)ok, (void)msg; abort(); }

#endif
