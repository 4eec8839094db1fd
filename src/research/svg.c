/* svg.c - see svg.h. */
#include "svg.h"

#include <math.h>

static void esc(FILE *f, const char *t)
{
    for (; t && *t; t++) {
        switch (*t) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*t, f);
        }
    }
}

int svg_open(svg *s, const char *path, int width, int height, const char *title)
{
    s->bad = 0;
    s->f = fopen(path, "w");
    if (!s->f) return -1;
    fprintf(s->f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" "
            "font-family=\"sans-serif\">\n<title>",
            width, height, width, height);
    esc(s->f, title);
    fprintf(s->f, "</title>\n<rect x=\"0\" y=\"0\" width=\"%d\" height=\"%d\" fill=\"white\"/>\n", width, height);
    return 0;
}

void svg_rect(svg *s, double x, double y, double w, double h, const char *fill, const char *cls, const char *tip)
{
    fprintf(s->f, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"", x, y, w, h);
    esc(s->f, fill);
    fputc('"', s->f);
    if (cls) {
        fputs(" class=\"", s->f);
        esc(s->f, cls);
        fputc('"', s->f);
    }
    if (tip) {
        fputs("><title>", s->f);
        esc(s->f, tip);
        fputs("</title></rect>\n", s->f);
    } else {
        fputs("/>\n", s->f);
    }
}

void svg_line(svg *s, double x1, double y1, double x2, double y2, const char *stroke, double width)
{
    fprintf(s->f, "<line x1=\"%.2f\" y1=\"%.2f\" x2=\"%.2f\" y2=\"%.2f\" stroke=\"", x1, y1, x2, y2);
    esc(s->f, stroke);
    fprintf(s->f, "\" stroke-width=\"%.2f\"/>\n", width);
}

void svg_polyline(svg *s, const double *xs, const double *ys, int n, const char *stroke, double width,
                  const char *cls)
{
    fputs("<polyline fill=\"none\" points=\"", s->f);
    for (int i = 0; i < n; i++) fprintf(s->f, "%s%.2f,%.2f", i ? " " : "", xs[i], ys[i]);
    fputs("\" stroke=\"", s->f);
    esc(s->f, stroke);
    fprintf(s->f, "\" stroke-width=\"%.2f\"", width);
    if (cls) {
        fputs(" class=\"", s->f);
        esc(s->f, cls);
        fputc('"', s->f);
    }
    fputs("/>\n", s->f);
}

void svg_text(svg *s, double x, double y, double size, const char *anchor, const char *text)
{
    fprintf(s->f, "<text x=\"%.2f\" y=\"%.2f\" font-size=\"%.2f\" text-anchor=\"%s\">", x, y, size, anchor);
    esc(s->f, text);
    fputs("</text>\n", s->f);
}

int svg_close(svg *s)
{
    fputs("</svg>\n", s->f);
    if (ferror(s->f)) s->bad = 1;
    if (fclose(s->f)) s->bad = 1;
    s->f = NULL;
    return s->bad ? -1 : 0;
}

void svg_scale_colour(double t, char out[8])
{
    /* three stops: #1f3a93 (0), #21a179 (0.5), #f5d90a (1) */
    static const double st[3][3] = {{31, 58, 147}, {33, 161, 121}, {245, 217, 10}};
    if (!(t >= 0)) t = 0;
    if (t > 1) t = 1;
    int i = t < 0.5 ? 0 : 1;
    double u = t < 0.5 ? t * 2 : (t - 0.5) * 2;
    int c[3];
    for (int k = 0; k < 3; k++) c[k] = (int)lround(st[i][k] + (st[i + 1][k] - st[i][k]) * u);
    snprintf(out, 8, "#%02x%02x%02x", c[0], c[1], c[2]);
}
