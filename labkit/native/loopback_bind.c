/* Preloaded into MPICH's mpiexec (hydra) and its proxies for jobs on one machine: a socket bound to every interface
 * (0.0.0.0 or ::) is bound to loopback instead (127.0.0.1 or ::1). Hydra has no option for the address of its
 * control port, which otherwise anyone on the network could reach while a job runs. Nothing else is changed.
 *
 * For a job across hosts, LABKIT_BIND_ADDRESS names the IPv4 address the other hosts reach this one by: a socket
 * bound to every interface is bound to that address instead, where that address is this machine's (elsewhere, on the
 * other hosts, the bind is left as it was). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            const char *chosen = getenv("LABKIT_BIND_ADDRESS");
            struct in_addr want;
            if (chosen && *chosen && inet_pton(AF_INET, chosen, &want) == 1) {
                a.sin_addr = want;
                int rc = real_bind(fd, (const struct sockaddr *)&a, sizeof a);
                if (rc == 0 || errno != EADDRNOTAVAIL) return rc;
                return real_bind(fd, addr, len); /* not this machine's address: another host of the job */
            }
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (memcmp(&a.sin6_addr, &in6addr_any, sizeof a.sin6_addr) == 0) {
            a.sin6_addr = in6addr_loopback;
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real_bind(fd, addr, len);
}
