/* server.h - `deltafin serve`: the HTTP front end (L5, like cli.c).
 *
 * OpenAI (chat completions, completions) and Anthropic (messages) APIs over
 * libmicrohttpd, streaming as SSE, one inference worker that owns the
 * session.  server.c documents the threading and the request rules.
 */
#ifndef DF_SERVER_H
#define DF_SERVER_H

/* argv as main got it (argv[1] = "serve"); returns the process exit code. */
int cmd_serve(int argc, char **argv);

#endif
