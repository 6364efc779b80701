/* The HTTP application: routes, request validation, and the scheduler that
 * runs every busy slot's next tokens as one engine batch per step
 * (continuous batching: a new request joins at the next step). */
#ifndef CB_APP_H
#define CB_APP_H

#include "engine.h"
#include "netloop.h"

typedef struct cb_app cb_app;

/* Allocates every per-slot buffer; NULL on failure. */
cb_app *cb_app_create(cb_engine *engine);
void cb_app_destroy(cb_app *app);
void cb_app_attach(cb_app *app, cb_netloop *loop);

/* netloop callbacks (app is the cb_app). */
void cb_app_on_request(void *app, cb_conn *c, const cb_http_request *req, const char *body, size_t len);
void cb_app_on_close(void *app, cb_conn_id id);

/* Runs one engine step over all busy slots; returns 1 while work remains. */
int cb_app_step(cb_app *app);
int cb_app_busy(const cb_app *app);

#endif
