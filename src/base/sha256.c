/* SHA-256 through OpenSSL's EVP interface (libcrypto); no hand-written hash. */
#include "base.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct em_sha256 {
    EVP_MD_CTX *ctx;
};

int em_sha256_create(em_sha256 **out, em_err *err) {
    *out = NULL;
    em_sha256 *s = em_calloc(1, sizeof *s, "sha256 context", err);
    if (!s) return EM_ENOMEM;
    s->ctx = EVP_MD_CTX_new();
    if (!s->ctx || EVP_DigestInit_ex(s->ctx, EVP_sha256(), NULL) != 1) {
        em_sha256_free(s);
        return em_err_set(err, EM_ENOMEM, "OpenSSL: cannot create a SHA-256 context");
    }
    *out = s;
    return EM_OK;
}

void em_sha256_update(em_sha256 *s, const void *data, size_t n) {
    if (n) EVP_DigestUpdate(s->ctx, data, n);
}

void em_sha256_final(em_sha256 *s, uint8_t digest[32]) {
    unsigned int len = 32;
    EVP_DigestFinal_ex(s->ctx, digest, &len);
}

void em_sha256_free(em_sha256 *s) {
    if (!s) return;
    EVP_MD_CTX_free(s->ctx);
    free(s);
}

void em_sha256_hex(const uint8_t digest[32], char hex[65]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 32; i++) {
        hex[2 * i] = digits[digest[i] >> 4];
        hex[2 * i + 1] = digits[digest[i] & 15];
    }
    hex[64] = 0;
}

int em_sha256_file(const char *path, char hex[65], em_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return em_err_set(err, EM_EIO, "%s: cannot open for hashing", path);
    em_sha256 *s;
    int rc = em_sha256_create(&s, err);
    size_t cap = 1 << 20;
    uint8_t *buf = rc ? NULL : em_malloc(cap, "hash buffer", err);
    if (!buf) rc = rc ? rc : EM_ENOMEM;
    for (uint64_t off = 0; rc == EM_OK;) {
        ssize_t r = pread(fd, buf, cap, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = em_err_set(err, EM_EIO, "%s: read failed at offset %llu while hashing", path,
                            (unsigned long long)off);
            break;
        }
        if (r == 0) break;
        em_sha256_update(s, buf, (size_t)r);
        off += (uint64_t)r;
    }
    if (rc == EM_OK) {
        uint8_t d[32];
        em_sha256_final(s, d);
        em_sha256_hex(d, hex);
    }
    free(buf);
    em_sha256_free(s);
    close(fd);
    return rc;
}
