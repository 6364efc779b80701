/* The constrained-decoding matcher alone (tests/test_constrain_c.py builds
 * it with AddressSanitizer and UBSan): the prefix + schema + suffix
 * contract, refusals by name, and the promise the max_tokens budget rests
 * on: from any state reached by valid bytes, cb_con_min_bytes() is exactly
 * the length of the shortest completion (a byte that lowers it by one
 * always exists, and none lowers it by more). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "constrain.h"

/* The token side is not under test here: stubs for the linker. */
int cb_is_end_token(const cb_tokenizer *t, int32_t id) { return (void)t, (void)id, 0; }
void cb_sample_candidates(cb_sampler *s, const float *l, const cb_sampling *p, const int32_t *h, int n,
                          cb_candidates *c) {
    (void)s, (void)l, (void)p, (void)h, (void)n, (void)c;
}
int32_t cb_sample_draw(cb_sampler *s, const cb_candidates *c, cb_rng *r, const uint8_t *o) {
    return (void)s, (void)c, (void)r, (void)o, -1;
}
int32_t cb_sample_masked(cb_sampler *s, const float *l, const cb_sampling *p, const int32_t *h, int n, cb_rng *r,
                         const uint8_t *a) {
    return (void)s, (void)l, (void)p, (void)h, (void)n, (void)r, (void)a, -1;
}
void cb_sample_best(cb_sampler *s, int k, int32_t *ids) { (void)s, (void)k, (void)ids; }
double cb_rng_uniform(cb_rng *r) { return (void)r, 0.0; }

static int passed, failed;
#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (cond) passed++;                                               \
        else {                                                            \
            failed++;                                                     \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                   \
            printf(__VA_ARGS__);                                          \
            printf("\n");                                                 \
        }                                                                 \
    } while (0)

static cb_json_tok toks[4096];
static cb_con_schema schema;
static char err[512];

/* Compiles json (NULL: any object); 0 or -1 with err. */
static int compile(const char *prefix, const char *json, const char *suffix) {
    int root = -1;
    if (json) {
        int n = cb_json_parse(json, strlen(json), toks, 4096, NULL);
        if (n < 0) return snprintf(err, sizeof err, "bad test JSON"), -1;
        root = 0;
    }
    return cb_con_compile(&schema, prefix, strlen(prefix), json, toks, root, suffix, strlen(suffix), err, sizeof err);
}

static int accepts(const char *text, int *complete) {
    cb_con_state s;
    cb_con_start(&schema, &s);
    int ok = cb_con_feed(&schema, &s, text, strlen(text));
    *complete = ok && cb_con_complete(&s);
    return ok;
}

static uint64_t rng_state = 88172645463325252ull;
static unsigned rnd(unsigned n) {
    rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % n);
}

/* From random states reached by random valid bytes, the shortest
 * completion is exactly min_bytes bytes long (0: the output may end here,
 * as a top-level number may). */
static void check_min_bytes(const char *name) {
    for (int walk = 0; walk < 40; walk++) {
        cb_con_state s, t;
        cb_con_start(&schema, &s);
        const int steps = (int)rnd(60);
        for (int i = 0; i < steps && !cb_con_complete(&s); i++) {
            int options[256], n = 0;
            for (int b = 1; b < 256; b++) {
                t = s;
                char c = (char)b;
                if (cb_con_feed(&schema, &t, &c, 1)) options[n++] = b;
            }
            CHECK(n > 0 || cb_con_accepting(&schema, &s), "%s: a state reached by valid bytes is a dead end", name);
            if (!n) break;
            char c = (char)options[rnd((unsigned)n)];
            cb_con_feed(&schema, &s, &c, 1);
        }
        uint32_t need = cb_con_min_bytes(&schema, &s), done = 0;
        while (cb_con_min_bytes(&schema, &s) > 0 && done <= need) {
            uint32_t best = 0xffffffffu;
            char pick = 0;
            for (int b = 1; b < 256; b++) {
                t = s;
                char c = (char)b;
                if (!cb_con_feed(&schema, &t, &c, 1)) continue;
                uint32_t m = cb_con_min_bytes(&schema, &t);
                if (m < best) best = m, pick = c;
            }
            CHECK(best + 1 >= cb_con_min_bytes(&schema, &s), "%s: a byte lowers min_bytes by more than one", name);
            if (best + 1 != cb_con_min_bytes(&schema, &s)) {
                CHECK(0, "%s: no byte lowers min_bytes %u by one (best %u)", name, cb_con_min_bytes(&schema, &s), best);
                return;
            }
            cb_con_feed(&schema, &s, &pick, 1);
            done++;
        }
        CHECK(cb_con_accepting(&schema, &s) && done == need, "%s: completed in %u bytes, min_bytes said %u", name, done,
              need);
    }
}

int main(void) {
    int complete;
    /* The tool-call form: literal prefix, schema, literal suffix, then the end. */
    const char *tool = "{\"type\":\"object\",\"properties\":{\"name\":{\"const\":\"get_weather\"},\"arguments\":"
                       "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],"
                       "\"additionalProperties\":false}},\"required\":[\"name\",\"arguments\"],\"additionalProperties\":false}";
    CHECK(compile("<tool_call>\n", tool, "\n</tool_call>") == 0, "compile: %s", err);
    CHECK(accepts("<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>", &complete) &&
              complete,
          "the tool call is accepted and complete");
    CHECK(accepts("<tool_call>\n{\"arguments\":{\"city\":\"\"},\"name\":\"get_weather\"}\n</tool_call>", &complete) &&
              complete,
          "keys in any order");
    CHECK(!accepts("<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\"}}\n</tool_call>\n", &complete),
          "nothing after the suffix");
    CHECK(!accepts("<tool_call>\n{\"name\":\"get_time\"", &complete), "the const name only");
    CHECK(!accepts("<tool_call> {", &complete), "the prefix exactly");
    CHECK(!accepts("<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{}}", &complete), "required 'city'");
    CHECK(!accepts("<tool_call>\n{\"name\":\"get_weather\",\"name\"", &complete), "a key twice");
    {
        cb_con_state s;
        cb_con_start(&schema, &s);
        const char *shortest = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"\"}}\n</tool_call>";
        CHECK(cb_con_min_bytes(&schema, &s) == strlen(shortest), "min_bytes %u, shortest %zu",
              cb_con_min_bytes(&schema, &s), strlen(shortest));
    }
    check_min_bytes("tool call");
    CHECK(compile("", NULL, "") == 0, "any object: %s", err);
    CHECK(accepts("{\"a\":[1,-2.5,\"\\u00e9\\n\",true,null,{}]}", &complete) && complete, "any object");
    CHECK(!accepts("[1]", &complete) && !accepts("{ }", &complete), "an object, no whitespace");
    check_min_bytes("any object");

    /* One schema per feature, with documents it must and must not take. */
    static const struct {
        const char *schema, *good, *bad;
    } cases[] = {
        {"{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":120}", "119", "120"},
        {"{\"type\":\"integer\",\"minimum\":-5,\"exclusiveMaximum\":120}", "-5", "-6"},
        {"{\"type\":\"number\",\"exclusiveMinimum\":0.5,\"maximum\":2}", "0.500001", "0.5,"},
        {"{\"type\":\"number\",\"minimum\":-1.25,\"maximum\":2}", "-1.25", "-1.26"},
        {"{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", "\"\\u00e9\xc3\xa9x\"", "\"abcd"},
        {"{\"type\":\"string\",\"minLength\":2}", "\"\xf0\x9f\xa6\x99!\"", "\"\xed\xa0\x80"},
        {"{\"type\":\"string\",\"format\":\"date\"}", "\"2024-02-28\"", "\"2024-13"},
        {"{\"type\":\"string\",\"format\":\"uuid\"}", "\"123e4567-e89b-12d3-a456-426614174000\"", "\"123e4567e"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2}", "[true,false]", "[]"},
        {"{\"type\":\"array\",\"items\":{\"type\":\"boolean\"},\"minItems\":1,\"maxItems\":2}", "[true]", "[true,true,"},
        {"{\"enum\":[\"red\",12,1,null,{\"k\":[1]}]}", "{\"k\":[1]}", "{\"k\":[2"},
        {"{\"enum\":[\"red\",12,1,null,{\"k\":[1]}]}", "12", "13"},
        {"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\",\"minimum\":10}]}", "\"a\"", "\"ab"},
        {"{\"anyOf\":[{\"type\":\"string\",\"maxLength\":1},{\"type\":\"integer\",\"minimum\":10}]}", "10", "9,"},
        {"{\"type\":[\"null\",\"boolean\"]}", "null", "0"},
        {"{\"type\":\"object\",\"properties\":{\"a\\\"b\":{\"type\":\"null\"}},\"required\":[\"a\\\"b\"],"
         "\"additionalProperties\":false}",
         "{\"a\\\"b\":null}", "{\"a\""},
        {"{\"type\":\"object\",\"properties\":{\"p\":{\"$ref\":\"#/$defs/P\"}},\"required\":[\"p\"],"
         "\"$defs\":{\"P\":{\"type\":\"integer\",\"maximum\":3}}}",
         "{\"p\":3}", "{\"p\":4"},
        {"{\"type\":\"object\",\"additionalProperties\":{\"type\":\"integer\"}}", "{\"any key\":1,\"b\":2}",
         "{\"k\":\"s"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        CHECK(compile("", cases[i].schema, "") == 0, "case %zu compiles: %s", i, err);
        CHECK(accepts(cases[i].good, &complete) && (complete || cases[i].good[0] == '-' || cases[i].good[0] == '1' ||
                                                    cases[i].good[0] == '0'),
              "case %zu takes %s", i, cases[i].good);
        CHECK(!accepts(cases[i].bad, &complete), "case %zu refuses %s", i, cases[i].bad);
        check_min_bytes(cases[i].schema);
    }

    /* Refused by name. */
    static const struct {
        const char *schema, *message;
    } refused[] = {
        {"{\"type\":\"string\",\"pattern\":\"a\"}", "the JSON Schema keyword 'pattern' is not supported (at #)"},
        {"{\"properties\":{\"x\":{\"allOf\":[]}}}", "'allOf' is not supported (at #/properties/x)"},
        {"{\"type\":\"string\",\"format\":\"email\"}", "'format' 'email' is not supported"},
        {"{\"$ref\":\"#/definitions/missing\"}", "'$ref' '#/definitions/missing' is not supported"},
        {"{\"type\":\"integer\",\"minimum\":3,\"maximum\":2}", "no value satisfies this schema"},
        {"{\"type\":\"number\",\"maximum\":1e12}", "out of the supported range"},
        {"{\"enum\":[1,2],\"type\":\"string\"}", "no value of 'enum'/'const' has the schema's 'type'"},
        {"{\"items\":{\"items\":{\"items\":{\"items\":{\"items\":{\"items\":{\"items\":{\"items\":{\"items\":{\"items\":"
         "{\"items\":{\"items\":{\"items\":{}}}}}}}}}}}}}}",
         "nests deeper than"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        CHECK(compile("", refused[i].schema, "") != 0 && strstr(err, refused[i].message), "refusal %zu: got '%s'", i,
              err);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
