/* Preloaded into MPICH's mpiexec (hydra) and its proxies for jobs on one machine: a socket bound to every interface
 * (0.0.0.0 or ::) is bound to loopback instead (127.0.0.1 or ::1). Hydra has no option for the address of its
 * control port, which otherwise anyone on the network could reach while a job runs. Nothing else is changed. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
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
