/*
 * vime-sandbox-launch: the one small exec of each local sandbox call that replaces util-linux's
 * `setpriv` (outside bubblewrap) and `prlimit` (inside it). Those two dynamically linked tools
 * cost about 1.7 ms per call together; this does the same work in a fraction of that.
 *
 *   vime-sandbox-launch [--uid=N --gid=N] [--close-fd=N] [--cpu=S[:H]] [--as=...] [--nproc=...]
 *                       [--fsize=...] [--nofile=...] [--core=...] -- PROGRAM [ARG...]
 *
 * --uid/--gid: drop to that user and group with no supplementary groups (like setpriv
 * --reuid --regid --clear-groups); refused unless both are given, and checked afterwards.
 * --close-fd: close that descriptor first (the one this binary was executed from, through
 * /proc/self/fd, inside the sandbox). The rlimit flags take prlimit's names and values: one
 * number sets soft and hard, SOFT:HARD sets both, "unlimited" is RLIM_INFINITY. They are
 * applied after the user switch, so they can only lower what that user could set itself.
 * Then PROGRAM is executed (searched on PATH when it has no slash).
 *
 * The whole command line is checked before anything changes. Exit status: 125 when this
 * program fails (with a message on stderr), 126/127 when PROGRAM cannot be executed / is not
 * found, else PROGRAM's own.
 *
 * Built by scripts/install.sh (cc -O2) into the virtualenv's bin directory; the local backend
 * falls back to setpriv + prlimit when it is missing.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#define NAME "vime-sandbox-launch"
#define FAIL 125

static const struct {
    const char *flag;
    int resource;
} LIMITS[] = {
    {"cpu", RLIMIT_CPU},     {"as", RLIMIT_AS},       {"nproc", RLIMIT_NPROC},
    {"fsize", RLIMIT_FSIZE}, {"nofile", RLIMIT_NOFILE}, {"core", RLIMIT_CORE},
};
#define NLIMITS (sizeof(LIMITS) / sizeof(LIMITS[0]))

static void fail(const char *fmt, const char *arg) {
    fprintf(stderr, NAME ": ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n");
    exit(FAIL);
}

static void fail_errno(const char *what) {
    fprintf(stderr, NAME ": %s: %s\n", what, strerror(errno));
    exit(FAIL);
}

/* A whole decimal number in [0, max], or fail naming the argument. */
static unsigned long long number(const char *text, unsigned long long max, const char *arg) {
    char *end;
    if (*text < '0' || *text > '9')
        fail("not a number in %s", arg);
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || *end || value > max)
        fail("not a number in range in %s", arg);
    return value;
}

static rlim_t limit_value(const char *text, const char *arg) {
    if (strcmp(text, "unlimited") == 0)
        return RLIM_INFINITY;
    return (rlim_t)number(text, RLIM_INFINITY - 1, arg);
}

/* "--NAME=VALUE" -> VALUE if arg starts with "--NAME=", else NULL. */
static const char *option(const char *arg, const char *name) {
    size_t n = strlen(name);
    if (strncmp(arg, "--", 2) || strncmp(arg + 2, name, n) || arg[2 + n] != '=')
        return NULL;
    return arg + 3 + n;
}

int main(int argc, char **argv) {
    struct rlimit limits[NLIMITS];
    int wanted[NLIMITS] = {0};
    long long uid = -1, gid = -1, close_fd = -1;
    int i;

    for (i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
        const char *arg = argv[i], *value;
        size_t k;
        if (strncmp(arg, "--", 2) != 0)
            fail("missing '--' before the program to run (at %s)", arg);
        if ((value = option(arg, "uid"))) {
            uid = (long long)number(value, (uid_t)-2, arg);
            continue;
        }
        if ((value = option(arg, "gid"))) {
            gid = (long long)number(value, (gid_t)-2, arg);
            continue;
        }
        if ((value = option(arg, "close-fd"))) {
            close_fd = (long long)number(value, 1 << 30, arg);
            continue;
        }
        for (k = 0; k < NLIMITS; k++) {
            if ((value = option(arg, LIMITS[k].flag)))
                break;
        }
        if (k == NLIMITS)
            fail("unknown option %s (see the comment at the top of sandboxes/launcher.c)", arg);
        char soft[32];
        const char *colon = strchr(value, ':');
        size_t len = colon ? (size_t)(colon - value) : strlen(value);
        if (len >= sizeof(soft))
            fail("not a number in range in %s", arg);
        memcpy(soft, value, len);
        soft[len] = '\0';
        limits[k].rlim_cur = limit_value(soft, arg);
        limits[k].rlim_max = colon ? limit_value(colon + 1, arg) : limits[k].rlim_cur;
        if (limits[k].rlim_cur > limits[k].rlim_max)
            fail("soft limit above the hard one in %s", arg);
        wanted[k] = 1;
    }
    if (i >= argc)
        fail("%s", "missing '--' before the program to run");
    if (i + 1 >= argc)
        fail("%s", "no program to run after '--'");
    if ((uid < 0) != (gid < 0))
        fail("%s", "--uid and --gid go together");

    if (close_fd >= 0 && close((int)close_fd) != 0)
        fail_errno("--close-fd");
    if (uid >= 0) {
        uid_t u;
        gid_t g;
        uid_t ru, eu, su;
        gid_t rg, eg, sg;
        u = (uid_t)uid;
        g = (gid_t)gid;
        if (setgroups(0, NULL) != 0)
            fail_errno("setgroups");
        if (setresgid(g, g, g) != 0)
            fail_errno("setresgid");
        if (setresuid(u, u, u) != 0)
            fail_errno("setresuid");
        if (getresuid(&ru, &eu, &su) != 0 || getresgid(&rg, &eg, &sg) != 0 || ru != u ||
            eu != u || su != u || rg != g || eg != g || sg != g)
            fail("%s", "the user switch did not take effect");
        /* With SECBIT_NO_SETUID_FIXUP inherited, capabilities would survive the switch. */
        if (u != 0 && setresuid(0, 0, 0) == 0)
            fail("%s", "root could be regained after the user switch");
    }
    for (size_t k = 0; k < NLIMITS; k++) {
        if (wanted[k] && setrlimit(LIMITS[k].resource, &limits[k]) != 0) {
            fprintf(stderr, NAME ": setting --%s: %s\n", LIMITS[k].flag, strerror(errno));
            return FAIL;
        }
    }
    execvp(argv[i + 1], argv + i + 1);
    int code = errno == ENOENT ? 127 : 126;
    fprintf(stderr, NAME ": cannot run %s: %s\n", argv[i + 1], strerror(errno));
    return code;
}
