/* svg.h - a small SVG writer for the research wing's plots (trace_plot.c):
 * a document, rectangles, lines, polylines and text, every string escaped;
 * numbers written with %.2f, so the same figures give the same bytes. */
#ifndef DF_SVG_H
#define DF_SVG_H

#include <stdio.h>

typedef struct svg {
    FILE *f;
    int bad;             /* a write failed */
} svg;

int svg_open(svg *s, const char *path, int width, int height, const char *title);
/* fill: a colour ("#rrggbb" or a name); cls: a class attribute or NULL */
void svg_rect(svg *s, double x, double y, double w, double h, const char *fill, const char *cls, const char *tip);
void svg_line(svg *s, double x1, double y1, double x2, double y2, const char *stroke, double width);
void svg_polyline(svg *s, const double *xs, const double *ys, int n, const char *stroke, double width,
                  const char *cls);
/* anchor: "start", "middle" or "end" */
void svg_text(svg *s, double x, double y, double size, const char *anchor, const char *text);
/* Closes the file; 0, or -1 when any write failed. */
int svg_close(svg *s);
/* A colour of a sequential scale (dark blue -> green -> yellow) for t in [0, 1]. */
void svg_scale_colour(double t, char out[8]);

#endif
