/* The LLAMBDA_* switches the C core reads from the environment, with the Python side's vocabulary
 * (llambda/switches.py): unset or empty is the default; a value the switch does not take is never
 * guessed at: one warning line on stderr names it, and the default applies. */
#ifndef LLB_ENV_H
#define LLB_ENV_H

/* 1/true/yes/on -> 1, 0/false/no/off -> 0 (any case, spaces around ignored); else `def`. */
int llb_env_flag(const char *name, int def);

/* A decimal whole number in [lo, hi]; else `def`. */
long llb_env_long(const char *name, long def, long lo, long hi);

/* The switch's value, spaces around it removed, in `buf` (cut to `size` - 1 bytes); its length before the
 * cut (at most 1 << 20), 0 if unset or empty. */
int llb_env_str(const char *name, char *buf, int size);

/* The warning for a set switch whose value is not what it `takes`: one line, ending with `def`. */
void llb_env_warn(const char *name, const char *takes, const char *def);

#endif
