/* Throwaway CA and certificates for TLS tests; see test_pki.h. */
#include "tests/wire/test_pki.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>

#include "runtime/base/status.h"

struct entity {
    EVP_PKEY *key;
    X509 *cert;
};

/* A certificate for `cn` signed by `issuer` (NULL = a self-signed CA). */
static int make_cert(struct entity *out, const char *cn, const struct entity *issuer) {
    static long serial = 1;
    out->key = EVP_EC_gen("P-256");
    out->cert = X509_new();
    if (!out->key || !out->cert) return strata_set_error(STRATA_EIO, "pki: key generation");
    X509_set_version(out->cert, 2);
    ASN1_INTEGER_set(X509_get_serialNumber(out->cert), serial++);
    X509_gmtime_adj(X509_getm_notBefore(out->cert), -60);
    X509_gmtime_adj(X509_getm_notAfter(out->cert), 2 * 86400);
    X509_set_pubkey(out->cert, out->key);
    X509_NAME *name = X509_get_subject_name(out->cert);
    X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, (const unsigned char *)cn, -1, -1, 0);
    X509_set_issuer_name(out->cert, issuer ? X509_get_subject_name(issuer->cert) : name);
    X509V3_CTX ctx;
    X509V3_set_ctx_nodb(&ctx);
    X509V3_set_ctx(&ctx, issuer ? issuer->cert : out->cert, out->cert, NULL, NULL, 0);
    X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, NID_basic_constraints,
                                              issuer ? "critical,CA:FALSE" : "critical,CA:TRUE");
    if (!ext) return strata_set_error(STRATA_EIO, "pki: basicConstraints");
    X509_add_ext(out->cert, ext, -1);
    X509_EXTENSION_free(ext);
    if (X509_sign(out->cert, issuer ? issuer->key : out->key, EVP_sha256()) <= 0)
        return strata_set_error(STRATA_EIO, "pki: signing %s", cn);
    return 0;
}

static int write_pem(const char *dir, const char *file, const struct entity *e, int with_key) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.crt", dir, file);
    FILE *f = fopen(path, "w");
    int ok = f && PEM_write_X509(f, e->cert);
    if (f) fclose(f);
    if (ok && with_key) {
        snprintf(path, sizeof path, "%s/%s.key", dir, file);
        f = fopen(path, "w");
        ok = f && PEM_write_PrivateKey(f, e->key, NULL, NULL, 0, NULL, NULL);
        if (f) fclose(f);
    }
    return ok ? 0 : strata_set_error(STRATA_EIO, "pki: cannot write %s", path);
}

int test_pki_make(const char *dir) {
    struct entity e[5] = {{0}};
    static const char *const names[5] = {"ca", "a", "b", "rogue-ca", "rogue"};
    static const int issuer[5] = {-1, 0, 0, -1, 3};
    int rc = 0;
    for (int i = 0; i < 5 && !rc; i++)
        rc = make_cert(&e[i], names[i], issuer[i] < 0 ? NULL : &e[issuer[i]]);
    for (int i = 0; i < 5 && !rc; i++)
        rc = write_pem(dir, names[i], &e[i], issuer[i] >= 0);
    for (int i = 0; i < 5; i++) {
        X509_free(e[i].cert);
        EVP_PKEY_free(e[i].key);
    }
    return rc;
}
