/* lineedit.h - a small line editor for the chat REPL (front end only).
 *
 * Owns: reading one line from the terminal in raw mode with editing keys
 * (left/right, Home/End, Ctrl-A/E/B/F, Backspace/Delete, Ctrl-U/K/W,
 * up/down history, Ctrl-C cancels the line, Ctrl-D on an empty line is end
 * of input), UTF-8 aware, restoring the terminal on every return.  When
 * stdin is not a terminal it reads plain lines.  Does not own: what the
 * lines mean.
 */
#ifndef DF_LINEEDIT_H
#define DF_LINEEDIT_H

typedef struct lineedit {
    char **hist;
    int n_hist, cap_hist;
    int tty;
} lineedit;

void lineedit_init(lineedit *le);
void lineedit_free(lineedit *le);
/* A malloc'd line without its newline, or NULL at end of input.
 * *cancelled = 1 when the user pressed Ctrl-C (the line is then ""). */
char *lineedit_read(lineedit *le, const char *prompt, int *cancelled);
void lineedit_history_add(lineedit *le, const char *line);

#endif
