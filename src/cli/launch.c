/* kapitsa launch AGENT [-- ARGS]: runs a coding agent against the local server.
 * Starts `kapitsa serve` (default model, 64k tokens of cache) if nothing answers
 * on the port, points the agent at it through environment variables and an
 * isolated, temporary config home (the user's own files are never touched),
 * runs it, and stops the server it started when the agent exits. */
#define _GNU_SOURCE
#include "../base/err.h"
#include "cli.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Whether GET /health answers 200 on 127.0.0.1:port. */
static int server_up(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return 0;
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    int ok = 0;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) == 0) {
        const char req[] = "GET /health HTTP/1.0\r\n\r\n";
        char buf[64] = {0};
        if (write(fd, req, sizeof req - 1) == (ssize_t)(sizeof req - 1) && read(fd, buf, sizeof buf - 1) > 0)
            ok = strstr(buf, " 200 ") != NULL;
    }
    close(fd);
    return ok;
}

int cli_launch(int argc, char **argv)
{
    if (argc < 1 || strcmp(argv[0], "--help") == 0) {
        fprintf(argc < 1 ? stderr : stdout,
                "usage: kapitsa launch claude|codex|opencode|pi [--port N] [--model DIR] [-- AGENT ARGS...]\n"
                "  starts the server if none answers on the port (default 11435), then runs the agent\n"
                "  configured for it in a temporary config home\n");
        return argc < 1 ? 2 : 0;
    }
    const char *agent = argv[0], *model = NULL, *port_s = "11435";
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
        int f = cli_flag(argc, argv, &i, "--port", &port_s);
        if (f == 0)
            f = cli_flag(argc, argv, &i, "--model", &model);
        if (f <= 0) {
            fprintf(stderr, "kapitsa launch: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    char **extra = i < argc ? argv + i + 1 : argv + argc;
    int n_extra = (int)(argv + argc - extra);
    int64_t port = cli_int(port_s);
    if (port < 1 || port > 65535) {
        fprintf(stderr, "kapitsa launch: bad port\n");
        return 2;
    }
    if (strcmp(agent, "claude") != 0) {
        fprintf(stderr, "kapitsa launch: '%s' is not supported yet (claude is)\n", agent);
        return 2;
    }
    char home[] = "/tmp/kapitsa-launch-XXXXXX";
    if (!mkdtemp(home)) {
        perror("kapitsa launch: mkdtemp");
        return 1;
    }
    pid_t server = 0;
    if (!server_up((int)port)) {
        char self[4096];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0) {
            fprintf(stderr, "kapitsa launch: cannot find its own binary\n");
            return 1;
        }
        self[n] = 0;
        server = fork();
        if (server == 0) {
            char log[4200];
            snprintf(log, sizeof log, "%s/server.log", home);
            if (!freopen(log, "w", stderr) || !freopen("/dev/null", "w", stdout))
                _exit(1);
            char *args[] = {self, "serve", "--port", (char *)port_s, "--ctx", "65536", model ? "--model" : NULL,
                            (char *)model, NULL};
            execv(self, args);
            _exit(127);
        }
        for (int t = 0; t < 600 && !server_up((int)port); t++) {
            struct timespec ts = {0, 100000000};
            nanosleep(&ts, NULL);
            if (waitpid(server, NULL, WNOHANG) == server) {
                fprintf(stderr, "kapitsa launch: the server did not start (see %s/server.log)\n", home);
                return 1;
            }
        }
    }
    char url[64];
    snprintf(url, sizeof url, "http://127.0.0.1:%lld", (long long)port);
    const char *name = getenv("KAPITSA_LAUNCH_MODEL");
    if (!name)
        name = "kapitsa-tiny";
    /* Claude Code: the API base, a token, the model, no traffic elsewhere, and a
     * config directory of its own */
    setenv("ANTHROPIC_BASE_URL", url, 1);
    setenv("ANTHROPIC_AUTH_TOKEN", "local", 1);
    setenv("ANTHROPIC_MODEL", name, 1);
    setenv("ANTHROPIC_SMALL_FAST_MODEL", name, 1);
    setenv("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1", 1);
    setenv("DISABLE_TELEMETRY", "1", 1);
    setenv("DISABLE_AUTOUPDATER", "1", 1);
    setenv("CLAUDE_CONFIG_DIR", home, 1);
    char **args = calloc((size_t)n_extra + 2, sizeof *args);
    if (!args)
        return 1;
    args[0] = "claude";
    for (int k = 0; k < n_extra; k++)
        args[k + 1] = extra[k];
    pid_t child = fork();
    if (child == 0) {
        execvp(args[0], args);
        fprintf(stderr, "kapitsa launch: cannot run '%s' (is it installed? npm i -g @anthropic-ai/claude-code)\n", args[0]);
        _exit(127);
    }
    int status = 1;
    signal(SIGINT, SIG_IGN); /* the agent handles Ctrl-C */
    waitpid(child, &status, 0);
    if (server > 0) {
        kill(server, SIGTERM);
        waitpid(server, NULL, 0);
    }
    free(args);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
