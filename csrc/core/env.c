/* Environment switches (env.h). */
#include "core/env.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int llb_env_str(const char *name, char *buf, int size) {
    const char *s = getenv(name);
    if (!s || size < 1) return 0;
    while (*s && isspace((unsigned char)*s)) s++;
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) n--;
    const size_t kept = n < (size_t)size - 1 ? n : (size_t)size - 1;
    memcpy(buf, s, kept);
    buf[kept] = 0;
    return n > (size_t)1 << 20 ? 1 << 20 : (int)n;
}

/* One line, whatever the value holds: control characters shown as '?'. */
void llb_env_warn(const char *name, const char *takes, const char *def) {
    char shown[64];
    const char *s = getenv(name);
    if (!s) s = ""; /* unset by another thread since it was read */
    size_t i = 0;
    for (; s[i] && i < sizeof shown - 4; i++) shown[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    strcpy(shown + i, s[i] ? "..." : "");
    fprintf(stderr, "llambda: warning: %s='%s' is not %s; using the default (%s)\n", name, shown, takes, def);
}

int llb_env_flag(const char *name, int def) {
    static const char *const yes[] = {"1", "true", "yes", "on"}, *const no[] = {"0", "false", "no", "off"};
    char v[8];
    const int n = llb_env_str(name, v, sizeof v);
    if (n == 0) return def;
    for (int i = 0; i < 4 && n < (int)sizeof v; i++) {
        if (strcasecmp(v, yes[i]) == 0) return 1;
        if (strcasecmp(v, no[i]) == 0) return 0;
    }
    llb_env_warn(name, "one of 1/true/yes/on or 0/false/no/off", def ? "on" : "off");
    return def;
}

long llb_env_long(const char *name, long def, long lo, long hi) {
    char v[32];
    const int n = llb_env_str(name, v, sizeof v);
    if (n == 0) return def;
    char *end;
    errno = 0;
    const long x = strtol(v, &end, 10);
    if (n < (int)sizeof v && errno == 0 && end != v && *end == 0 && x >= lo && x <= hi) return x;
    char takes[80], shown[24];
    snprintf(takes, sizeof takes, "a whole number in %ld..%ld", lo, hi);
    snprintf(shown, sizeof shown, "%ld", def);
    llb_env_warn(name, takes, shown);
    return def;
}
