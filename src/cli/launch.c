/* kapitsa launch AGENT [-- ARGS]: runs a coding agent against the local server.
 * Starts `kapitsa serve` (default model, 64k tokens of cache) if nothing answers
 * on the port, asks it which model it serves, points the agent at it through
 * environment variables and files in a config folder of its own (the user's
 * own configuration is never read or written), runs it, and stops the server
 * it started when the agent exits.
 *
 * The folder is the same at each launch, $XDG_STATE_HOME/kapitsa/agents/AGENT
 * (~/.local/state/... without it): Claude Code's system prompt names its memory
 * folder under CLAUDE_CONFIG_DIR, so a fresh folder each launch would change
 * the prompt's first tokens and the server would prefill all of it (~19k
 * tokens) again for every session instead of reusing it.
 *
 * What each agent reads (their documented configuration):
 *   claude   ANTHROPIC_BASE_URL / _AUTH_TOKEN / _MODEL, CLAUDE_CONFIG_DIR
 *   codex    CODEX_HOME/config.toml: a model provider on the Responses API
 *   opencode OPENCODE_CONFIG: an extra config file with an openai-compatible provider
 *   pi       PI_CODING_AGENT_DIR/models.json and settings.json
 *   qwen     Qwen Code: OPENAI_BASE_URL / _API_KEY / _MODEL, QWEN_HOME/settings.json */
#define _GNU_SOURCE
#include "../base/err.h"
#include "cli.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What the agent is pointed at. */
struct target {
    const char *home; /* the agent's config folder */
    char url[64];     /* http://127.0.0.1:PORT */
    char model[256];  /* the id the server answers to */
    long long n_ctx;  /* its context length */
    const char *key;  /* the server's API key, or a placeholder */
};

/* GET path on 127.0.0.1:port; the status code, with the body in buf (NUL
 * terminated, truncated to cap-1), or -1 if nothing answers. */
static int http_get(int port, const char *path, const char *key, char *buf, size_t cap)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int status = -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        char req[512];
        int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nx-api-key: %s\r\n\r\n", path, key);
        size_t got = 0;
        ssize_t r = 0;
        if (write(fd, req, (size_t)n) == n)
            while (got + 1 < cap && (r = read(fd, buf + got, cap - 1 - got)) > 0)
                got += (size_t)r;
        buf[got] = 0;
        if (sscanf(buf, "HTTP/%*s %d", &status) != 1)
            status = -1;
        char *body = strstr(buf, "\r\n\r\n");
        memmove(buf, body ? body + 4 : buf + got, strlen(body ? body + 4 : buf + got) + 1);
    }
    close(fd);
    return status;
}

/* The served model's id and context length from GET /v1/models. */
static int ask_model(int port, struct target *t)
{
    static char buf[1 << 16];
    int status = http_get(port, "/v1/models", t->key, buf, sizeof buf);
    if (status == 401)
        return err_set("the server on port %d wants an API key: set KAPITSA_API_KEY", port);
    json_t *root = status == 200 ? json_loads(buf, 0, NULL) : NULL;
    json_t *m = json_array_get(json_object_get(root, "data"), 0);
    const char *id = json_string_value(json_object_get(m, "id"));
    int rc = 0;
    if (!id || strlen(id) >= sizeof t->model)
        rc = err_set("the server on port %d did not list its model (GET /v1/models: %d)", port, status);
    else {
        strcpy(t->model, id);
        json_int_t n = json_integer_value(json_object_get(m, "max_model_len"));
        t->n_ctx = n > 0 ? (long long)n : 32768;
    }
    json_decref(root);
    return rc;
}

/* home/rel, its folders made; printf-style contents. */
static int put_file(const char *home, const char *rel, const char *fmt, ...) KP_PRINTF(3, 4);
static int put_file(const char *home, const char *rel, const char *fmt, ...)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", home, rel);
    for (char *s = strchr(path + strlen(home) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = 0;
        mkdir(path, 0700);
        *s = '/';
    }
    FILE *f = fopen(path, "w");
    if (!f)
        return err_set("cannot write %s", path);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    return fclose(f) == 0 ? 0 : err_set("cannot write %s", path);
}

/* the model id as a JSON or TOML string (both escape the same way here) */
static const char *quoted(const char *s, char *buf, size_t cap)
{
    json_t *j = json_string(s);
    char *d = json_dumps(j, JSON_ENCODE_ANY);
    snprintf(buf, cap, "%s", d ? d : "\"\"");
    free(d);
    json_decref(j);
    return buf;
}

static int setup_claude(const struct target *t)
{
    setenv("ANTHROPIC_BASE_URL", t->url, 1);
    setenv("ANTHROPIC_AUTH_TOKEN", t->key, 1);
    setenv("ANTHROPIC_MODEL", t->model, 1);
    setenv("ANTHROPIC_SMALL_FAST_MODEL", t->model, 1);
    setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1", 1);
    setenv("DISABLE_TELEMETRY", "1", 1);
    setenv("DISABLE_AUTOUPDATER", "1", 1);
    /* the per-request attribution line at the top of the system prompt would
     * change every request's first tokens and defeat prefix reuse */
    setenv("CLAUDE_CODE_ATTRIBUTION_HEADER", "0", 1);
    setenv("CLAUDE_CONFIG_DIR", t->home, 1);
    return 0;
}

static int setup_codex(const struct target *t)
{
    char q[600];
    if (put_file(t->home, "config.toml",
                 "model = %s\nmodel_provider = \"kapitsa\"\n\n[model_providers.kapitsa]\nname = \"Kapitsa\"\n"
                 "base_url = \"%s/v1\"\nenv_key = \"KAPITSA_API_KEY\"\nwire_api = \"responses\"\n",
                 quoted(t->model, q, sizeof q), t->url) != 0)
        return -1;
    setenv("CODEX_HOME", t->home, 1);
    setenv("KAPITSA_API_KEY", t->key, 1);
    return 0;
}

static int setup_opencode(const struct target *t)
{
    char q[600], full[800], path[4200];
    char *m = NULL;
    if (asprintf(&m, "kapitsa/%s", t->model) < 0)
        return err_set("out of memory");
    quoted(m, full, sizeof full);
    free(m);
    if (put_file(t->home, "opencode.json",
                 "{\n  \"$schema\": \"https://opencode.ai/config.json\",\n  \"provider\": {\n    \"kapitsa\": {\n"
                 "      \"npm\": \"@ai-sdk/openai-compatible\",\n      \"name\": \"Kapitsa\",\n"
                 "      \"options\": {\"baseURL\": \"%s/v1\", \"apiKey\": \"{env:KAPITSA_API_KEY}\"},\n"
                 "      \"models\": {%s: {\"limit\": {\"context\": %lld, \"output\": 4096}}}\n    }\n  },\n"
                 "  \"model\": %s,\n  \"small_model\": %s,\n  \"autoupdate\": false,\n  \"share\": \"disabled\"\n}\n",
                 t->url, quoted(t->model, q, sizeof q), t->n_ctx, full, full) != 0)
        return -1;
    snprintf(path, sizeof path, "%s/opencode.json", t->home);
    setenv("OPENCODE_CONFIG", path, 1);
    setenv("KAPITSA_API_KEY", t->key, 1);
    return 0;
}

static int setup_pi(const struct target *t)
{
    char q[600];
    quoted(t->model, q, sizeof q);
    if (put_file(t->home, "models.json",
                 "{\"providers\": {\"kapitsa\": {\"baseUrl\": \"%s/v1\", \"api\": \"openai-completions\", "
                 "\"apiKey\": \"KAPITSA_API_KEY\",\n  \"models\": [{\"id\": %s, \"contextWindow\": %lld, "
                 "\"maxTokens\": 4096}]}}}\n",
                 t->url, q, t->n_ctx) != 0 ||
        put_file(t->home, "settings.json",
                 "{\"defaultProvider\": \"kapitsa\", \"defaultModel\": %s, \"enableInstallTelemetry\": false}\n", q) != 0)
        return -1;
    setenv("PI_CODING_AGENT_DIR", t->home, 1);
    setenv("PI_OFFLINE", "1", 1);
    setenv("KAPITSA_API_KEY", t->key, 1);
    return 0;
}

static int setup_qwen(const struct target *t)
{
    char q[600], url[80];
    /* $version: the settings schema this is written in, so that Qwen Code does not migrate (rewrite) it */
    if (put_file(t->home, "settings.json",
                 "{\"$version\": 4, \"security\": {\"auth\": {\"selectedType\": \"openai\"}},\n"
                 " \"model\": {\"name\": %s, \"generationConfig\": {\"contextWindowSize\": %lld}},\n"
                 " \"general\": {\"enableAutoUpdate\": false}, \"privacy\": {\"usageStatisticsEnabled\": false}}\n",
                 quoted(t->model, q, sizeof q), t->n_ctx) != 0)
        return -1;
    snprintf(url, sizeof url, "%s/v1", t->url);
    setenv("QWEN_HOME", t->home, 1);
    setenv("OPENAI_BASE_URL", url, 1);
    setenv("OPENAI_API_KEY", t->key, 1);
    setenv("OPENAI_MODEL", t->model, 1);
    setenv("QWEN_CODE_MAX_OUTPUT_TOKENS", "4096", 1); /* as the others' configs ask */
    return 0;
}

static const struct agent {
    const char *name, *exe, *package;
    int (*setup)(const struct target *t);
} agents[] = {
    {"claude", "claude", "@anthropic-ai/claude-code", setup_claude},
    {"codex", "codex", "@openai/codex", setup_codex},
    {"opencode", "opencode", "opencode-ai", setup_opencode},
    {"pi", "pi", "@mariozechner/pi-coding-agent", setup_pi},
    {"qwen", "qwen", "@qwen-code/qwen-code", setup_qwen},
};

/* The agent's config folder (see the top), made if missing. */
static int agent_home(const char *name, char *dir, size_t cap)
{
    const char *x = getenv("XDG_STATE_HOME"), *h = getenv("HOME");
    int n;
    if (x && x[0] == '/') /* the XDG rule: a relative path is ignored */
        n = snprintf(dir, cap, "%s/kapitsa/agents/%s", x, name);
    else if (h && *h)
        n = snprintf(dir, cap, "%s/.local/state/kapitsa/agents/%s", h, name);
    else
        return err_set("neither XDG_STATE_HOME nor HOME is set: no folder for the agent's configuration");
    if (n < 0 || (size_t)n >= cap)
        return err_set("the agent's config folder's path is too long");
    for (char *s = strchr(dir + 1, '/');; s = strchr(s + 1, '/')) {
        if (s)
            *s = 0;
        if (mkdir(dir, 0700) != 0 && errno != EEXIST)
            return err_set("cannot make %s: %s", dir, strerror(errno));
        if (!s)
            return 0;
        *s = '/';
    }
}

int cli_on_path(const char *exe)
{
    const char *path = getenv("PATH");
    if (!path || !*path)
        path = "/usr/bin:/bin";
    while (*path) {
        const size_t n = strcspn(path, ":");
        char f[4096];
        snprintf(f, sizeof f, "%.*s/%s", n ? (int)n : 1, n ? path : ".", exe);
        struct stat st;
        if (stat(f, &st) == 0 && S_ISREG(st.st_mode) && access(f, X_OK) == 0)
            return 1;
        path += n + (path[n] == ':');
    }
    return 0;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* The server's load progress (the lines serve writes to its log, loading
 * ...) shown on launch's stderr as they come: on a terminal one line redrawn.
 * *at: how far the log was read; *shown: a line is on the terminal unended. */
static void show_progress(const char *log, long *at, bool *shown)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return;
    const bool tty = isatty(2) != 0;
    char line[512];
    fseek(f, *at, SEEK_SET);
    while (fgets(line, sizeof line, f)) {
        const size_t n = strlen(line);
        if (line[n - 1] != '\n') /* not yet whole: read again next time */
            break;
        *at = ftell(f);
        if (strncmp(line, "loading ", 8) != 0)
            continue;
        if (tty)
            line[n - 1] = 0;
        fprintf(stderr, "%s%s", tty ? "\r\033[K" : "", line);
        *shown = tty;
    }
    fclose(f);
}

/* Starts the server on port (stderr to home/server.log); its pid, or -1. */
static pid_t start_server(const char *home, const char *port_s, int port, const char *model)
{
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        err_set("cannot find its own binary");
        return -1;
    }
    self[n] = 0;
    pid_t server = fork();
    if (server == 0) {
        char log[4200];
        snprintf(log, sizeof log, "%s/server.log", home);
        if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout))
            _exit(1);
        /* the host given, as KAPITSA_HOST would otherwise move it off the loopback launch talks to */
        char *args[] = {self,   "serve", "--host", "127.0.0.1", "--port", (char *)port_s, "--ctx", "65536",
                        model ? "--model" : NULL, (char *)model, NULL};
        execv(self, args);
        _exit(127);
    }
    if (server < 0) {
        err_set("fork: %s", strerror(errno));
        return -1;
    }
    char buf[64], log[4200];
    snprintf(log, sizeof log, "%s/server.log", home);
    long at = 0;
    bool shown = false;
    for (int t = 0; t < 600; t++) {
        show_progress(log, &at, &shown);
        if (http_get(port, "/health", "", buf, sizeof buf) == 200) {
            show_progress(log, &at, &shown);
            if (shown)
                fputc('\n', stderr);
            return server;
        }
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
        if (waitpid(server, NULL, WNOHANG) == server)
            break;
    }
    if (shown)
        fputc('\n', stderr);
    kill(server, SIGTERM);
    waitpid(server, NULL, 0);
    err_set("the server did not start (see %s/server.log)", home);
    return -1;
}

static void launch_usage(FILE *f)
{
    fprintf(f, "usage: kapitsa launch claude|codex|opencode|pi|qwen [--port N] [-m|--model M] [-- AGENT ARGS...]\n"
               "  starts the server if none answers on the port (default 11435, or KAPITSA_PORT), then runs\n"
               "  the agent configured for it in its own folder, the same each time, $XDG_STATE_HOME/kapitsa/\n"
               "  agents/AGENT (~/.local/state/...; your own agent settings are not touched);\n"
               "  KAPITSA_API_KEY: the key of a server started with --api-key\n");
}

int cli_launch(int argc, char **argv)
{
    if (argc < 1)
        return launch_usage(stderr), 2;
    const enum cli_arg a0 = cli_arg(argv[0]);
    if (a0 != CLI_ARG_POSITIONAL)
        return cli_arg_exit(a0, launch_usage);
    const struct agent *ag = NULL;
    for (size_t k = 0; k < sizeof agents / sizeof *agents; k++)
        if (strcmp(argv[0], agents[k].name) == 0)
            ag = &agents[k];
    if (!ag) {
        fprintf(stderr, "kapitsa launch: unknown agent '%s' (claude, codex, opencode, pi or qwen)\n", argv[0]);
        return 2;
    }
    const char *model = NULL, *port_s = getenv("KAPITSA_PORT");
    if (!port_s || !*port_s)
        port_s = "11435";
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        int f = cli_flag(argc, argv, &i, "--port", &port_s);
        if (f == 0)
            f = cli_flag(argc, argv, &i, "-m|--model", &model);
        if (f == 0)
            return cli_arg_reject(argv[i], launch_usage);
        if (f < 0)
            return 2;
    }
    char **extra = i < argc ? argv + i + 1 : argv + argc;
    int n_extra = (int)(argv + argc - extra);
    int64_t port = cli_int(port_s);
    if (port < 1 || port > 65535) {
        fprintf(stderr, "kapitsa launch: the port (--port or KAPITSA_PORT) is 1 to 65535, not '%s'\n", port_s);
        return 2;
    }
    if (!cli_on_path(ag->exe)) {
        fprintf(stderr, "kapitsa launch: '%s' is not on PATH; install it with: npm i -g %s\n", ag->exe, ag->package);
        return 127;
    }
    char home[] = "/tmp/kapitsa-launch-XXXXXX", dir[4096]; /* home: the log of a server launch starts */
    if (agent_home(ag->name, dir, sizeof dir) != 0) {
        fprintf(stderr, "kapitsa launch: %s\n", err_msg());
        return 1;
    }
    if (!mkdtemp(home)) {
        perror("kapitsa launch: mkdtemp");
        return 1;
    }
    struct target t = {.home = dir, .key = getenv("KAPITSA_API_KEY")};
    if (!t.key || !*t.key)
        t.key = "local";
    snprintf(t.url, sizeof t.url, "http://127.0.0.1:%lld", (long long)port);
    pid_t server = 0, child = -1;
    char **args = calloc((size_t)n_extra + 2, sizeof *args);
    int status = 1 << 8, keep = 0;
    char buf[64];
    if (!args) {
        err_set("out of memory");
        goto fail;
    }
    if (http_get((int)port, "/health", "", buf, sizeof buf) != 200 &&
        (server = start_server(home, port_s, (int)port, model)) < 0) {
        keep = 1;
        goto fail;
    }
    if (ask_model((int)port, &t) != 0 || ag->setup(&t) != 0)
        goto fail;
    args[0] = (char *)ag->exe;
    for (int k = 0; k < n_extra; k++)
        args[k + 1] = extra[k];
    child = fork();
    if (child == 0) {
        execvp(args[0], args);
        fprintf(stderr, "kapitsa launch: cannot run '%s' (is it installed? npm i -g %s)\n", args[0], ag->package);
        _exit(127);
    }
    signal(SIGINT, SIG_IGN); /* the agent handles Ctrl-C */
    if (child > 0)
        waitpid(child, &status, 0);
    else
        err_set("fork: %s", strerror(errno));
fail:
    if (child < 0)
        fprintf(stderr, "kapitsa launch: %s\n", err_msg());
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
    }
    free(args);
    if (!keep)
        nftw(home, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return child > 0 && WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
