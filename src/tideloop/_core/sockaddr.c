/* Socket addresses as Python objects, the way the socket module shows them. */
#include "internal.h"

#include <netdb.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>

PyObject *
tl_sockaddr_to_py(const struct sockaddr *sa, unsigned int len)
{
    if (len == 0)
        Py_RETURN_NONE;
    switch (sa->sa_family) {
    case AF_INET:
    case AF_INET6: {
        char host[NI_MAXHOST];
        int rc = getnameinfo(sa, len, host, sizeof(host), NULL, 0,
                             NI_NUMERICHOST);
        if (rc != 0) {
            PyErr_Format(PyExc_OSError, "getnameinfo failed: %s",
                         gai_strerror(rc));
            return NULL;
        }
        if (sa->sa_family == AF_INET) {
            const struct sockaddr_in *a = (const struct sockaddr_in *)sa;
            return Py_BuildValue("si", host, ntohs(a->sin_port));
        }
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)sa;
        return Py_BuildValue("siII", host, ntohs(a->sin6_port),
                             ntohl(a->sin6_flowinfo), a->sin6_scope_id);
    }
    case AF_UNIX: {
        const struct sockaddr_un *a = (const struct sockaddr_un *)sa;
        size_t plen = len - offsetof(struct sockaddr_un, sun_path);
        if ((socklen_t)offsetof(struct sockaddr_un, sun_path) >= len)
            return PyUnicode_FromString("");
        if (a->sun_path[0] == '\0')   /* Linux abstract namespace */
            return PyBytes_FromStringAndSize(a->sun_path, (Py_ssize_t)plen);
        plen = strnlen(a->sun_path, plen);
        return PyUnicode_DecodeFSDefaultAndSize(a->sun_path, (Py_ssize_t)plen);
    }
    default:
        return Py_BuildValue("(iy#)", sa->sa_family, sa->sa_data,
                             (Py_ssize_t)sizeof(sa->sa_data));
    }
}
