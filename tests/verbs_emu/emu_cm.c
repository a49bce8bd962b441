/* tests/verbs_emu/emu_cm.c — the librdmacm half of the test-only RDMA
 * device (overview in emu_int.h): event channels, cm_ids, address and
 * route resolution, listen, connect, accept, reject and disconnect.
 *
 * A listener is an abstract unix socket "dkvfs-verbs-emu-UID-PORT" and a
 * thread that accepts and reads each CM_REQ into a CONNECT_REQUEST event.
 * Handshake on the new stream, as IB CM's REQ / REP / RTU:
 *
 *   active                                 passive
 *   rdma_connect:   CM_REQ(priv 56)  --->  CONNECT_REQUEST event
 *                                    <---  rdma_accept: CM_REP(priv 196), QP RTR
 *   ESTABLISHED, QP RTS:   CM_RTU    --->  ESTABLISHED, QP RTS
 *               (or)                 <---  rdma_reject: CM_REJ(priv 148) -> REJECTED
 *
 * Events travel through a pipe as pointers, so the channel fd polls as
 * librdmacm's does and O_NONBLOCK on it works. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "emu_int.h"

enum emu_id_state {
	EMU_IDLE,
	EMU_BOUND,	 /* bound or address resolved */
	EMU_LISTENING,
	EMU_REQUESTED,	 /* passive: a CONNECT_REQUEST not yet answered */
	EMU_CONNECTING,	 /* REQ sent (active) or REP sent (passive) */
	EMU_ESTABLISHED,
	EMU_DONE,	 /* rejected, disconnected or failed */
};

struct emu_chan {
	struct rdma_event_channel pub; /* pub.fd: read end of a pipe of events */
	int wfd;
};

struct emu_event {
	struct rdma_cm_event pub;
	uint8_t priv[EMU_REP_PRIV];
};

struct emu_id {
	struct rdma_cm_id pub;
	pthread_mutex_t lock; /* protects pub.channel, state, disc_posted */
	enum emu_id_state state;
	bool disc_posted;
	struct emu_id *listener; /* the listener a passive id came from */
	int lfd, lstop;		 /* listener: socket, stop eventfd */
	pthread_t lthr;
	bool lstarted;
	struct emu_link *link;
	uint8_t ack_timeout; /* RDMA_OPTION_ID_ACK_TIMEOUT, 0: not set */
	uint8_t retry_count, peer_rnr_retry;
	uint8_t req_init_depth; /* passive: the initiator depth the REQ asked */
};

static struct emu_id *emu_id_of(struct rdma_cm_id *id)
{
	return (struct emu_id *)id;
}

static int emu_fail(int err)
{
	errno = err;
	return -1;
}

/* ---- events ---- */

void emu_cm_post(struct rdma_cm_id *pub, enum rdma_cm_event_type t, int status,
		 const void *priv, size_t priv_cap, const struct emu_hdr *h)
{
	struct emu_id *id = emu_id_of(pub);
	struct emu_event *ev = calloc(1, sizeof(*ev));
	struct emu_chan *ch;

	if (!ev) {
		fprintf(stderr, "verbs-emu: out of memory, CM event lost\n");
		return;
	}
	ev->pub.id = pub;
	ev->pub.listen_id = id->listener ? &id->listener->pub : NULL;
	ev->pub.event = t;
	ev->pub.status = status;
	if (priv) {
		memcpy(ev->priv, priv, priv_cap);
		ev->pub.param.conn.private_data = ev->priv;
		ev->pub.param.conn.private_data_len = (uint8_t)priv_cap;
	}
	if (h) {
		ev->pub.param.conn.responder_resources = h->resp_res;
		ev->pub.param.conn.initiator_depth = h->init_depth;
	}
	pthread_mutex_lock(&id->lock);
	ch = (struct emu_chan *)pub->channel;
	pthread_mutex_unlock(&id->lock);
	/* the last touch of id: the owner may destroy it once it has the event */
	if (write(ch->wfd, &ev, sizeof(ev)) != sizeof(ev)) {
		fprintf(stderr, "verbs-emu: CM event lost\n");
		free(ev);
	}
}

struct rdma_event_channel *rdma_create_event_channel(void)
{
	struct emu_chan *ch = calloc(1, sizeof(*ch));
	int p[2];

	if (!ch || pipe2(p, O_CLOEXEC) < 0) {
		free(ch);
		errno = ENOMEM;
		return NULL;
	}
	emu_init();
	ch->pub.fd = p[0];
	ch->wfd = p[1];
	return &ch->pub;
}

int rdma_get_cm_event(struct rdma_event_channel *channel, struct rdma_cm_event **event)
{
	struct emu_event *ev;
	ssize_t n = read(channel->fd, &ev, sizeof(ev));

	if (n != sizeof(ev))
		return emu_fail(n < 0 ? errno : EIO);
	*event = &ev->pub;
	return 0;
}

int rdma_ack_cm_event(struct rdma_cm_event *event)
{
	free(event);
	return 0;
}

/* Pending events are freed; a connection request nobody took is refused
 * (its id destroyed, the requester sees the stream close). */
void rdma_destroy_event_channel(struct rdma_event_channel *channel)
{
	struct emu_chan *ch = (struct emu_chan *)channel;
	struct emu_event *ev;

	fcntl(ch->pub.fd, F_SETFL, O_NONBLOCK);
	while (read(ch->pub.fd, &ev, sizeof(ev)) == sizeof(ev)) {
		if (ev->pub.event == RDMA_CM_EVENT_CONNECT_REQUEST)
			rdma_destroy_id(ev->pub.id);
		free(ev);
	}
	close(ch->pub.fd);
	close(ch->wfd);
	free(ch);
}

const char *rdma_event_str(enum rdma_cm_event_type event)
{
	static const char *const s[] = {
	    [RDMA_CM_EVENT_ADDR_RESOLVED] = "RDMA_CM_EVENT_ADDR_RESOLVED",
	    [RDMA_CM_EVENT_ADDR_ERROR] = "RDMA_CM_EVENT_ADDR_ERROR",
	    [RDMA_CM_EVENT_ROUTE_RESOLVED] = "RDMA_CM_EVENT_ROUTE_RESOLVED",
	    [RDMA_CM_EVENT_ROUTE_ERROR] = "RDMA_CM_EVENT_ROUTE_ERROR",
	    [RDMA_CM_EVENT_CONNECT_REQUEST] = "RDMA_CM_EVENT_CONNECT_REQUEST",
	    [RDMA_CM_EVENT_CONNECT_RESPONSE] = "RDMA_CM_EVENT_CONNECT_RESPONSE",
	    [RDMA_CM_EVENT_CONNECT_ERROR] = "RDMA_CM_EVENT_CONNECT_ERROR",
	    [RDMA_CM_EVENT_UNREACHABLE] = "RDMA_CM_EVENT_UNREACHABLE",
	    [RDMA_CM_EVENT_REJECTED] = "RDMA_CM_EVENT_REJECTED",
	    [RDMA_CM_EVENT_ESTABLISHED] = "RDMA_CM_EVENT_ESTABLISHED",
	    [RDMA_CM_EVENT_DISCONNECTED] = "RDMA_CM_EVENT_DISCONNECTED",
	    [RDMA_CM_EVENT_DEVICE_REMOVAL] = "RDMA_CM_EVENT_DEVICE_REMOVAL",
	    [RDMA_CM_EVENT_TIMEWAIT_EXIT] = "RDMA_CM_EVENT_TIMEWAIT_EXIT",
	};

	if ((unsigned)event < sizeof(s) / sizeof(s[0]) && s[event])
		return s[event];
	return "UNKNOWN EVENT";
}

/* ---- devices ---- */

struct ibv_context **rdma_get_devices(int *num_devices)
{
	struct ibv_context **l = calloc(2, sizeof(*l));

	if (!l) {
		errno = ENOMEM;
		return NULL;
	}
	emu_init();
	l[0] = &emu_ctx;
	if (num_devices)
		*num_devices = 1;
	return l;
}

void rdma_free_devices(struct ibv_context **list)
{
	free(list);
}

/* ---- ids ---- */

int rdma_create_id(struct rdma_event_channel *channel, struct rdma_cm_id **out, void *context,
		   enum rdma_port_space ps)
{
	struct emu_id *id;

	if (!channel || !out || ps != RDMA_PS_TCP)
		return emu_fail(EINVAL);
	id = calloc(1, sizeof(*id));
	if (!id)
		return emu_fail(ENOMEM);
	pthread_mutex_init(&id->lock, NULL);
	id->pub.channel = channel;
	id->pub.context = context;
	id->pub.ps = ps;
	id->pub.qp_type = IBV_QPT_RC;
	id->lfd = id->lstop = -1;
	id->retry_count = 7;
	*out = &id->pub;
	return 0;
}

static void emu_sockname(uint16_t port, struct sockaddr_un *un, socklen_t *len)
{
	int n;

	memset(un, 0, sizeof(*un));
	un->sun_family = AF_UNIX;
	n = snprintf(un->sun_path + 1, sizeof(un->sun_path) - 1, "dkvfs-verbs-emu-%u-%u",
		     (unsigned)getuid(), (unsigned)port);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static uint16_t emu_port(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET6)
		return ntohs(((const struct sockaddr_in6 *)sa)->sin6_port);
	return ntohs(((const struct sockaddr_in *)sa)->sin_port);
}

static void emu_set_port(struct sockaddr *sa, uint16_t port)
{
	if (sa->sa_family == AF_INET6)
		((struct sockaddr_in6 *)sa)->sin6_port = htons(port);
	else
		((struct sockaddr_in *)sa)->sin_port = htons(port);
}

static uint16_t emu_random_port(void)
{
	static _Atomic unsigned seq;
	unsigned x = (unsigned)emu_now_ns() ^ ((unsigned)getpid() << 8) ^ (seq++ * 7919u);

	return (uint16_t)(20000 + x % 40000);
}

static int emu_copy_addr(struct sockaddr_storage *dst, const struct sockaddr *sa)
{
	if (!sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6))
		return -1;
	memset(dst, 0, sizeof(*dst));
	memcpy(dst, sa,
	       sa->sa_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6));
	return 0;
}

/* Binding takes the port's socket name at once (EADDRINUSE as a CM would);
 * port 0 picks a free one. */
int rdma_bind_addr(struct rdma_cm_id *pub, struct sockaddr *addr)
{
	struct emu_id *id = emu_id_of(pub);
	struct sockaddr *src = &pub->route.addr.src_addr;
	struct sockaddr_un un;
	socklen_t unlen;
	uint16_t port;
	int fd, tries;

	if (id->state != EMU_IDLE || emu_copy_addr(&pub->route.addr.src_storage, addr))
		return emu_fail(EINVAL);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	port = emu_port(src);
	for (tries = 0; tries < 200; tries++) {
		uint16_t p = port ? port : emu_random_port();

		emu_sockname(p, &un, &unlen);
		if (bind(fd, (struct sockaddr *)&un, unlen) == 0) {
			emu_set_port(src, p);
			break;
		}
		if (port || errno != EADDRINUSE) {
			int e = errno;

			close(fd);
			return emu_fail(e);
		}
	}
	if (tries == 200) {
		close(fd);
		return emu_fail(EADDRINUSE);
	}
	id->lfd = fd;
	pub->verbs = &emu_ctx;
	pub->port_num = 1;
	id->state = EMU_BOUND;
	return 0;
}

/* "verbs-emu-cm": turns each incoming CM_REQ into a CONNECT_REQUEST. */
static void *emu_listen_main(void *arg)
{
	struct emu_id *l = arg;
	struct pollfd p[2] = {{.fd = l->lfd, .events = POLLIN}, {.fd = l->lstop, .events = POLLIN}};

	pthread_setname_np(pthread_self(), "verbs-emu-cm");
	for (;;) {
		struct emu_hdr h;
		uint8_t priv[EMU_REQ_PRIV];
		struct emu_id *c;
		struct rdma_cm_id *cpub;
		int fd;

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents)
			break;
		fd = accept4(l->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		if (emu_read_full(fd, &h, sizeof(h), l->lstop, 2000) || h.type != EMU_CM_REQ ||
		    h.len != EMU_REQ_PRIV || emu_read_full(fd, priv, sizeof(priv), l->lstop, 2000) ||
		    rdma_create_id(l->pub.channel, &cpub, l->pub.context, RDMA_PS_TCP)) {
			close(fd);
			continue;
		}
		c = emu_id_of(cpub);
		c->link = emu_link_create(fd);
		if (!c->link) {
			close(fd);
			rdma_destroy_id(cpub);
			continue;
		}
		c->listener = l;
		c->state = EMU_REQUESTED;
		c->retry_count = (uint8_t)(h.rkey & 7);
		c->peer_rnr_retry = (uint8_t)(h.imm & 7);
		c->req_init_depth = h.init_depth;
		cpub->verbs = &emu_ctx;
		cpub->port_num = 1;
		cpub->route.addr.src_storage = l->pub.route.addr.src_storage;
		cpub->route.addr.dst_sin.sin_family = AF_INET;
		cpub->route.addr.dst_sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		cpub->route.addr.dst_sin.sin_port = htons((uint16_t)h.raddr);
		pthread_mutex_lock(&l->lock);
		cpub->channel = l->pub.channel;
		pthread_mutex_unlock(&l->lock);
		emu_cm_post(cpub, RDMA_CM_EVENT_CONNECT_REQUEST, 0, priv, sizeof(priv), &h);
	}
	return NULL;
}

int rdma_listen(struct rdma_cm_id *pub, int backlog)
{
	struct emu_id *id = emu_id_of(pub);

	if (id->state != EMU_BOUND || id->lfd < 0)
		return emu_fail(EINVAL);
	if (listen(id->lfd, backlog > 0 ? backlog : 16) < 0)
		return -1;
	id->lstop = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (id->lstop < 0)
		return -1;
	if (pthread_create(&id->lthr, NULL, emu_listen_main, id))
		return emu_fail(EAGAIN);
	id->lstarted = true;
	id->state = EMU_LISTENING;
	return 0;
}

int rdma_resolve_addr(struct rdma_cm_id *pub, struct sockaddr *src, struct sockaddr *dst,
		      int timeout_ms)
{
	struct emu_id *id = emu_id_of(pub);

	if (id->state != EMU_IDLE || timeout_ms <= 0 ||
	    emu_copy_addr(&pub->route.addr.dst_storage, dst))
		return emu_fail(EINVAL);
	pub->route.addr.src_sin.sin_family = AF_INET;
	pub->route.addr.src_sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	pub->route.addr.src_sin.sin_port = htons(emu_random_port());
	pub->verbs = &emu_ctx;
	pub->port_num = 1;
	id->state = EMU_BOUND;
	emu_cm_post(pub, RDMA_CM_EVENT_ADDR_RESOLVED, 0, NULL, 0, NULL);
	return 0;
}

int rdma_resolve_route(struct rdma_cm_id *pub, int timeout_ms)
{
	if (emu_id_of(pub)->state != EMU_BOUND || timeout_ms <= 0 ||
	    !pub->route.addr.dst_addr.sa_family)
		return emu_fail(EINVAL);
	emu_cm_post(pub, RDMA_CM_EVENT_ROUTE_RESOLVED, 0, NULL, 0, NULL);
	return 0;
}

int rdma_migrate_id(struct rdma_cm_id *pub, struct rdma_event_channel *channel)
{
	struct emu_id *id = emu_id_of(pub);

	if (!channel)
		return emu_fail(EINVAL);
	pthread_mutex_lock(&id->lock);
	pub->channel = channel;
	pthread_mutex_unlock(&id->lock);
	return 0;
}

int rdma_set_option(struct rdma_cm_id *pub, int level, int optname, void *optval,
		    size_t optlen)
{
	if (level != RDMA_OPTION_ID || optname != RDMA_OPTION_ID_ACK_TIMEOUT || optlen != 1 ||
	    !optval || *(uint8_t *)optval > 31)
		return emu_fail(EINVAL);
	emu_id_of(pub)->ack_timeout = *(uint8_t *)optval;
	return 0;
}

int rdma_create_qp(struct rdma_cm_id *pub, struct ibv_pd *pd, struct ibv_qp_init_attr *attr)
{
	struct ibv_qp *qp;

	/* rdma_cm insists the PD is on the id's device */
	if (!pub->verbs || !pd || pd->context != pub->verbs || pub->qp)
		return emu_fail(EINVAL);
	qp = emu_qp_create(pd, attr);
	if (!qp)
		return -1;
	pub->qp = qp;
	return 0;
}

void rdma_destroy_qp(struct rdma_cm_id *pub)
{
	struct emu_id *id = emu_id_of(pub);

	if (!pub->qp)
		return;
	emu_link_stop(id->link); /* no thread touches the QP after this */
	emu_qp_destroy(pub->qp);
	pub->qp = NULL;
}

int rdma_destroy_id(struct rdma_cm_id *pub)
{
	struct emu_id *id = emu_id_of(pub);
	uint64_t one = 1;

	if (id->lstarted) {
		if (write(id->lstop, &one, sizeof(one)) != sizeof(one))
			fprintf(stderr, "verbs-emu: waking the listener failed\n");
		pthread_join(id->lthr, NULL);
	}
	rdma_destroy_qp(pub);
	emu_link_destroy(id->link);
	if (id->lfd >= 0)
		close(id->lfd);
	if (id->lstop >= 0)
		close(id->lstop);
	pthread_mutex_destroy(&id->lock);
	free(id);
	return 0;
}

/* ---- connection establishment ---- */

/* The ACK timeout and RNR budget a QP runs with, from what the CM got. */
static void emu_qp_timers(struct emu_id *id)
{
	struct emu_qp *qp = (struct emu_qp *)id->pub.qp;
	uint8_t t = id->ack_timeout ? id->ack_timeout : 18;

	pthread_mutex_lock(&qp->lock);
	qp->ack_timeout_ns = (int64_t)((id->retry_count + 1) * 4096.0 * (double)(1ull << t));
	qp->rnr_budget_ns = id->peer_rnr_retry == 7
				? INT64_MAX
				: (int64_t)id->peer_rnr_retry * EMU_RNR_TIMER_MS * 1000000;
	pthread_mutex_unlock(&qp->lock);
}

static void emu_qp_state(struct rdma_cm_id *pub, enum ibv_qp_state st)
{
	struct emu_qp *qp = (struct emu_qp *)pub->qp;

	pthread_mutex_lock(&qp->lock);
	if (qp->pub.state != IBV_QPS_ERR)
		qp->pub.state = st;
	pthread_mutex_unlock(&qp->lock);
}

/* The QP's responder resources, as librdmacm programs them: the value given,
 * or with RDMA_MAX_RESP_RES (or no param, on accept) the peer's initiator
 * depth, at most the device's. */
static void emu_qp_resp_res(struct rdma_cm_id *pub, const struct rdma_conn_param *p,
			    uint8_t peer_init_depth)
{
	unsigned r = p && p->responder_resources != RDMA_MAX_RESP_RES ? p->responder_resources
								      : peer_init_depth;

	((struct emu_qp *)pub->qp)->max_dest_rd = (uint8_t)(r < EMU_MAX_RD_ATOM ? r : EMU_MAX_RD_ATOM);
}

static int emu_pad(uint8_t *dst, size_t cap, const struct rdma_conn_param *p)
{
	memset(dst, 0, cap);
	if (!p)
		return 0;
	if (p->private_data_len > cap || (p->private_data_len && !p->private_data))
		return -1;
	if (p->private_data_len)
		memcpy(dst, p->private_data, p->private_data_len);
	return 0;
}

int rdma_connect(struct rdma_cm_id *pub, struct rdma_conn_param *param)
{
	struct emu_id *id = emu_id_of(pub);
	struct emu_hdr h = {.type = EMU_CM_REQ, .len = EMU_REQ_PRIV};
	uint8_t priv[EMU_REQ_PRIV];
	struct sockaddr_un un;
	socklen_t unlen;
	int fd;

	if (id->state != EMU_BOUND || !pub->qp || !param || emu_pad(priv, sizeof(priv), param))
		return emu_fail(EINVAL);
	h.resp_res = param->responder_resources;
	h.init_depth = param->initiator_depth;
	h.rkey = param->retry_count & 7;
	h.imm = param->rnr_retry_count & 7;
	h.raddr = ntohs(pub->route.addr.src_sin.sin_port);
	id->retry_count = param->retry_count & 7;
	emu_qp_resp_res(pub, param, EMU_MAX_RD_ATOM);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	emu_sockname(emu_port(&pub->route.addr.dst_addr), &un, &unlen);
	if (connect(fd, (struct sockaddr *)&un, unlen) < 0 || emu_write_full(fd, &h, sizeof(h)) ||
	    emu_write_full(fd, priv, sizeof(priv))) {
		/* nobody listens on that port: the CM answers with a REJ */
		close(fd);
		id->state = EMU_DONE;
		emu_cm_post(pub, RDMA_CM_EVENT_REJECTED, EMU_REJ_NO_LISTEN, NULL, 0, NULL);
		return 0;
	}
	id->link = emu_link_create(fd);
	if (!id->link) {
		close(fd);
		return emu_fail(ENOMEM);
	}
	((struct emu_qp *)pub->qp)->link = id->link;
	id->state = EMU_CONNECTING;
	emu_link_start(id->link, pub);
	return 0;
}

int rdma_accept(struct rdma_cm_id *pub, struct rdma_conn_param *param)
{
	struct emu_id *id = emu_id_of(pub);
	struct emu_hdr h = {.type = EMU_CM_REP, .len = EMU_REP_PRIV};
	uint8_t priv[EMU_REP_PRIV];

	if (id->state != EMU_REQUESTED || !pub->qp || emu_pad(priv, sizeof(priv), param))
		return emu_fail(EINVAL);
	if (param) {
		h.resp_res = param->responder_resources;
		h.init_depth = param->initiator_depth;
		h.imm = param->rnr_retry_count & 7;
	}
	emu_qp_timers(id);
	emu_qp_resp_res(pub, param, id->req_init_depth);
	((struct emu_qp *)pub->qp)->link = id->link;
	emu_qp_state(pub, IBV_QPS_RTR);
	pthread_mutex_lock(&id->lock);
	id->state = EMU_CONNECTING;
	pthread_mutex_unlock(&id->lock);
	emu_link_start(id->link, pub);
	emu_link_send(id->link, &h, priv);
	return 0;
}

int rdma_reject(struct rdma_cm_id *pub, const void *private_data, uint8_t private_data_len)
{
	struct emu_id *id = emu_id_of(pub);
	struct emu_hdr h = {.type = EMU_CM_REJ, .len = EMU_REJ_PRIV};
	struct rdma_conn_param p = {.private_data = private_data,
				    .private_data_len = private_data_len};
	uint8_t priv[EMU_REJ_PRIV];
	int fd;

	if (id->state != EMU_REQUESTED || emu_pad(priv, sizeof(priv), &p))
		return emu_fail(EINVAL);
	fd = id->link ? emu_link_fd(id->link) : -1;
	id->state = EMU_DONE;
	if (fd >= 0 && (emu_write_full(fd, &h, sizeof(h)) || emu_write_full(fd, priv, sizeof(priv))))
		return emu_fail(ECONNRESET);
	if (fd >= 0)
		shutdown(fd, SHUT_WR);
	return 0;
}

/* rx thread: a CM message on an established stream. */
void emu_cm_link_event(struct rdma_cm_id *pub, const struct emu_msg *m)
{
	struct emu_id *id = emu_id_of(pub);
	struct emu_hdr rtu = {.type = EMU_CM_RTU};
	enum emu_id_state st;

	pthread_mutex_lock(&id->lock);
	st = id->state;
	if (st == EMU_CONNECTING && (m->h.type == EMU_CM_REP || m->h.type == EMU_CM_RTU))
		id->state = EMU_ESTABLISHED;
	else if (st == EMU_CONNECTING && m->h.type == EMU_CM_REJ)
		id->state = EMU_DONE;
	pthread_mutex_unlock(&id->lock);
	if (st != EMU_CONNECTING)
		return; /* out of place: ignored, as a CM drops stray MADs */
	if (m->h.type == EMU_CM_REP && m->h.len == EMU_REP_PRIV && pub->qp) {
		id->peer_rnr_retry = (uint8_t)(m->h.imm & 7);
		emu_qp_timers(id);
		emu_qp_state(pub, IBV_QPS_RTS);
		emu_link_send(id->link, &rtu, NULL);
		emu_cm_post(pub, RDMA_CM_EVENT_ESTABLISHED, 0, m->data, EMU_REP_PRIV, &m->h);
	} else if (m->h.type == EMU_CM_RTU && pub->qp) {
		emu_qp_state(pub, IBV_QPS_RTS);
		emu_cm_post(pub, RDMA_CM_EVENT_ESTABLISHED, 0, NULL, 0, NULL);
	} else if (m->h.type == EMU_CM_REJ && m->h.len == EMU_REJ_PRIV) {
		emu_cm_post(pub, RDMA_CM_EVENT_REJECTED, EMU_REJ_CONSUMER, m->data, EMU_REJ_PRIV,
			    NULL);
	}
}

/* The QP errors: everything outstanding is flushed. */
static void emu_flush(struct rdma_cm_id *pub)
{
	struct emu_qp *qp = (struct emu_qp *)pub->qp;

	if (!qp)
		return;
	pthread_mutex_lock(&qp->lock);
	if (qp->pub.state != IBV_QPS_ERR)
		emu_qp_error(qp, UINT64_MAX, IBV_WC_WR_FLUSH_ERR);
	pthread_mutex_unlock(&qp->lock);
}

/* Connection over (EOF, or our own disconnect): flush, and tell the owner
 * once with the event its state calls for. */
static void emu_cm_end(struct emu_id *id)
{
	enum emu_id_state st;
	bool post_disc;

	pthread_mutex_lock(&id->lock);
	st = id->state;
	post_disc = st == EMU_ESTABLISHED && !id->disc_posted;
	if (post_disc)
		id->disc_posted = true;
	if (st == EMU_CONNECTING || st == EMU_ESTABLISHED)
		id->state = EMU_DONE;
	pthread_mutex_unlock(&id->lock);
	emu_flush(&id->pub);
	if (post_disc)
		emu_cm_post(&id->pub, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, 0, NULL);
	else if (st == EMU_CONNECTING)
		emu_cm_post(&id->pub, RDMA_CM_EVENT_CONNECT_ERROR, -ECONNRESET, NULL, 0, NULL);
}

void emu_cm_link_down(struct rdma_cm_id *pub)
{
	emu_cm_end(emu_id_of(pub));
}

int rdma_disconnect(struct rdma_cm_id *pub)
{
	struct emu_id *id = emu_id_of(pub);
	enum emu_id_state st;

	pthread_mutex_lock(&id->lock);
	st = id->state;
	pthread_mutex_unlock(&id->lock);
	if (st != EMU_ESTABLISHED && st != EMU_CONNECTING)
		return emu_fail(EINVAL);
	emu_cm_end(id);
	if (id->link)
		shutdown(emu_link_fd(id->link), SHUT_RDWR); /* the peer sees it at once */
	return 0;
}
