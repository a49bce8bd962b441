/* tests/net/test_rdma.c — the rdma backend on a machine without a device.
 *
 * CI has no RDMA device (and no rxe), so what can run here is: the "no
 * device" path through the public API (one log line, -DKV_E_NODEVICE, fast,
 * no crash), NET_AUTO never picking rdma, and the backend's pure pieces that
 * do not need a NIC: verbs error styles -> -errno, completion status ->
 * -errno, private-data framing, the ACK-timeout choice and the WR-slot
 * bookkeeping that turns ibv_wc into net_wc.
 *
 * To reach the static helpers this file includes net/net_rdma.c itself; the
 * test object then defines net_rdma_ops and net_rdma_available, so the
 * linker never pulls net_rdma.o out of libnet.a and net.c dispatches to this
 * very copy.  docs/rdma.md says how to test the rest on hardware.
 */
#include "net/net_rdma.c"

#include <criterion/criterion.h>
#include <dirent.h>

/* Independent oracle: does sysfs list any RDMA device? */
static bool sysfs_has_rdma_device(void)
{
	DIR *dir = opendir("/sys/class/infiniband");
	struct dirent *e;
	bool found = false;

	if (!dir)
		return false;
	while (!found && (e = readdir(dir)))
		found = e->d_name[0] != '.';
	closedir(dir);
	return found;
}

static void skip_if_device(void)
{
	if (sysfs_has_rdma_device())
		cr_skip_test("this machine has an RDMA device; the no-device tests do not apply");
}

/* Run net_domain_create(NET_RDMA) with stderr captured into buf. */
static int create_capturing_stderr(struct net_domain **d, char *buf, size_t cap, int64_t *ms)
{
	FILE *tmp = tmpfile();
	int saved, rc;
	int64_t t0;
	size_t n;

	cr_assert_not_null(tmp);
	fflush(stderr);
	saved = dup(STDERR_FILENO);
	cr_assert_geq(saved, 0);
	cr_assert_geq(dup2(fileno(tmp), STDERR_FILENO), 0);
	t0 = nrdma_now_ms();
	rc = net_domain_create(NET_RDMA, d);
	*ms = nrdma_now_ms() - t0;
	fflush(stderr);
	dup2(saved, STDERR_FILENO);
	close(saved);
	rewind(tmp);
	n = fread(buf, 1, cap - 1, tmp);
	buf[n] = '\0';
	fclose(tmp);
	return rc;
}

static int count_lines(const char *s)
{
	int n = 0;

	for (; *s; s++)
		n += *s == '\n';
	return n;
}

Test(rdma_nodev, domain_create_fails_fast_with_one_line)
{
	struct net_domain *d = NULL;
	char log[4096];
	int64_t ms;
	int rc;

	skip_if_device();
	rc = create_capturing_stderr(&d, log, sizeof(log), &ms);
	cr_assert_eq(rc, -DKV_E_NODEVICE, "rc=%d (%s)", rc, dkv_strerror(rc));
	cr_assert_null(d, "no domain may be returned on failure");
	cr_assert_lt(ms, 2000, "took %lld ms", (long long)ms);
	cr_assert_not_null(strstr(log, "no RDMA device found; use transport=tcp"), "log: '%s'",
			   log);
	cr_assert_eq(count_lines(log), 1, "expected exactly one log line, got: '%s'", log);
}

Test(rdma_nodev, domain_create_repeats_cleanly)
{
	struct net_domain *d = NULL;

	skip_if_device();
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(net_rdma_ops.domain_create(&d), -DKV_E_NODEVICE);
		cr_assert_null(d);
	}
	/* the public entry point agrees with the backend */
	cr_assert_eq(net_domain_create(NET_RDMA, &d), -DKV_E_NODEVICE);
	cr_assert_null(d);
}

Test(rdma_nodev, not_available)
{
	skip_if_device();
	cr_assert_not(net_rdma_available());
}

Test(rdma_nodev, auto_never_picks_rdma_without_device)
{
	skip_if_device();
	cr_assert_neq(net_kind_resolve(NET_AUTO, "127.0.0.1:1"), NET_RDMA);
	cr_assert_eq(net_kind_resolve(NET_AUTO, "127.0.0.1:1"), NET_LOCAL);
	/* TEST-NET-1 (RFC 5737): never this host, so auto means tcp */
	cr_assert_eq(net_kind_resolve(NET_AUTO, "192.0.2.1:7"), NET_TCP);
	/* an explicit kind is kept */
	cr_assert_eq(net_kind_resolve(NET_RDMA, "127.0.0.1:1"), NET_RDMA);
}

Test(rdma_ops, table_is_complete)
{
	const struct net_ops *o = &net_rdma_ops;

	cr_assert_str_eq(o->name, "rdma");
	cr_assert(o->domain_create && o->domain_destroy && o->reg_mr && o->dereg_mr);
	cr_assert(o->grant && o->revoke && o->listen && o->listener_addr && o->listener_fd);
	cr_assert(o->get_request && o->req_priv && o->req_peer && o->accept && o->reject);
	cr_assert(o->listener_close && o->connect && o->conn_peer && o->conn_ok && o->close);
	cr_assert(o->post && o->poll && o->conn_fd && o->set_fault && o->conn_stats);
	cr_assert(o->conn_reaping);
	cr_assert_eq(strcmp(net_kind_name(NET_RDMA), "rdma"), 0);
}

Test(rdma_err, three_verbs_error_styles)
{
	errno = 0;
	cr_assert_eq(nrdma_rc(0), 0);
	cr_assert_eq(nrdma_rc(EINVAL), -EINVAL);   /* positive errno return */
	errno = EBUSY;
	cr_assert_eq(nrdma_rc(-1), -EBUSY);        /* -1 + errno */
	errno = 0;
	cr_assert_eq(nrdma_rc(-1), -EIO);          /* -1 without errno */
	errno = ENOMEM;
	cr_assert_eq(nrdma_ptr_err(EIO), -ENOMEM); /* NULL + errno */
	errno = 0;
	cr_assert_eq(nrdma_ptr_err(EIO), -EIO);
}

Test(rdma_err, wc_status_mapping)
{
	cr_assert_eq(nrdma_wc_status_err(IBV_WC_SUCCESS), 0);
	cr_assert_eq(nrdma_wc_status_err(IBV_WC_REM_ACCESS_ERR), -DKV_E_GRANT);
	cr_assert_eq(nrdma_wc_status_err(IBV_WC_RETRY_EXC_ERR), -ETIMEDOUT);
	cr_assert_eq(nrdma_wc_status_err(IBV_WC_WR_FLUSH_ERR), -ECONNRESET);
	cr_assert_eq(nrdma_wc_status_err(IBV_WC_LOC_LEN_ERR), -EMSGSIZE);
	cr_assert_eq(nrdma_wc_status_err(IBV_WC_REM_INV_REQ_ERR), -EMSGSIZE);
	cr_assert_eq(nrdma_wc_status_err(IBV_WC_RNR_RETRY_EXC_ERR), -ENOBUFS);
	/* every failure status is an error, never 0 and never positive */
	for (int s = IBV_WC_SUCCESS + 1; s <= IBV_WC_TM_RNDV_INCOMPLETE + 5; s++)
		cr_assert_lt(nrdma_wc_status_err((enum ibv_wc_status)s), 0, "status %d", s);
}

Test(rdma_err, access_flags)
{
	cr_assert_eq(nrdma_access(0), 0);
	cr_assert_eq(nrdma_access(NET_ACCESS_LOCAL_WRITE), IBV_ACCESS_LOCAL_WRITE);
	cr_assert_eq(nrdma_access(NET_ACCESS_REMOTE_READ), IBV_ACCESS_REMOTE_READ);
	/* verbs rejects REMOTE_WRITE without LOCAL_WRITE */
	cr_assert_eq(nrdma_access(NET_ACCESS_REMOTE_WRITE),
		     IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
}

Test(rdma_timeout, ack_timeout_is_op_timeout_to_five_quarters_of_it)
{
	static const int ms[] = { 1, 10, 100, 600, 1000, 3000, 5000, 30000, 120000 };
	double prev = 0;

	for (size_t i = 0; i < sizeof(ms) / sizeof(ms[0]); i++) {
		uint8_t t, r;

		nrdma_ack_timing(ms[i], &t, &r);
		double total_ms = 4.096e-3 * (double)(1ull << t) * (r + 1);

		cr_assert(t >= 1 && t <= 31 && r <= NRDMA_RETRY_CNT, "t=%u r=%u", t, r);
		cr_assert(total_ms >= ms[i] && total_ms < ms[i] * 1.25,
			  "op %d ms -> t=%u r=%u -> %.1f ms", ms[i], t, r, total_ms);
		cr_assert_geq(total_ms, prev, "not monotone at %d ms", ms[i]);
		prev = total_ms;
	}
}

Test(rdma_priv, round_trip_every_length)
{
	uint8_t in[NET_PRIV_MAX], wire[NRDMA_PRIV_WIRE], padded[96];
	const uint8_t *data;
	size_t wl, len;

	for (size_t i = 0; i < sizeof(in); i++)
		in[i] = (uint8_t)(0xa5 ^ i);
	for (size_t n = 0; n <= NET_PRIV_MAX; n++) {
		cr_assert_eq(nrdma_priv_pack(wire, sizeof(wire), in, n, &wl), 0);
		cr_assert_eq(wl, n + 1);
		/* the CM delivers it zero-padded to a fixed size */
		memset(padded, 0, sizeof(padded));
		memcpy(padded, wire, wl);
		cr_assert_eq(nrdma_priv_unpack(padded, sizeof(padded), &data, &len), 0);
		cr_assert_eq(len, n);
		cr_assert_eq(memcmp(data, in, n), 0);
	}
	/* a connect REQ has 56 bytes: the length byte leaves 55 */
	cr_assert_eq(nrdma_priv_pack(wire, NET_PRIV_MAX, in, NET_PRIV_MAX - 1, &wl), 0);
	cr_assert_eq(nrdma_priv_pack(wire, NET_PRIV_MAX, in, NET_PRIV_MAX, &wl), -EINVAL);
	cr_assert_eq(nrdma_priv_pack(wire, sizeof(wire), NULL, 3, &wl), -EINVAL);
}

Test(rdma_priv, malformed_input)
{
	uint8_t raw[8] = { 7, 1, 2, 3, 4, 5, 6, 7 };
	uint8_t big[200] = { NET_PRIV_MAX + 1 };
	const uint8_t *data;
	size_t len;

	cr_assert_eq(nrdma_priv_unpack(raw, sizeof(raw), &data, &len), 0);
	cr_assert_eq(len, 7);
	cr_assert_eq(nrdma_priv_unpack(raw, 7, &data, &len), -EPROTO); /* length past the end */
	cr_assert_eq(nrdma_priv_unpack(big, sizeof(big), &data, &len), -EPROTO);
	cr_assert_eq(nrdma_priv_unpack(NULL, 0, &data, &len), 0);
	cr_assert_eq(len, 0);
}

Test(rdma_priv, copy_truncates_and_reports)
{
	const uint8_t src[5] = { 1, 2, 3, 4, 5 };
	uint8_t dst[3] = { 0 };
	size_t rlen = sizeof(dst);

	nrdma_priv_copy(src, sizeof(src), dst, &rlen);
	cr_assert_eq(rlen, 3);
	cr_assert_eq(memcmp(dst, src, 3), 0);
	rlen = 9;
	nrdma_priv_copy(src, sizeof(src), NULL, &rlen);
	cr_assert_eq(rlen, 0);
	nrdma_priv_copy(src, sizeof(src), dst, NULL); /* no crash */
}

Test(rdma_misc, format_addresses)
{
	struct sockaddr_in in = { .sin_family = AF_INET, .sin_port = htons(4791) };
	struct sockaddr_in6 in6 = { .sin6_family = AF_INET6, .sin6_port = htons(9) };
	char buf[NRDMA_ADDR_MAX];

	inet_pton(AF_INET, "10.0.0.7", &in.sin_addr);
	inet_pton(AF_INET6, "::1", &in6.sin6_addr);
	nrdma_fmt_addr((struct sockaddr *)&in, buf, sizeof(buf));
	cr_assert_str_eq(buf, "10.0.0.7:4791");
	nrdma_fmt_addr((struct sockaddr *)&in6, buf, sizeof(buf));
	cr_assert_str_eq(buf, "[::1]:9");
	nrdma_fmt_addr(NULL, buf, sizeof(buf));
	cr_assert_str_eq(buf, "?");
}

/* A conn with a WR-slot table but no verbs objects: enough to drive the
 * bookkeeping between ibv_post_* and ibv_wc. */
static struct nrdma_conn *fake_conn(uint32_t nsend, uint32_t nrecv)
{
	struct nrdma_conn *c = calloc(1, sizeof(*c));
	uint32_t i;

	cr_assert_not_null(c);
	c->head.ops = &net_rdma_ops;
	pthread_mutex_init(&c->slot_lock, NULL);
	c->nsend = nsend;
	c->nrecv = nrecv;
	c->slots = calloc(nsend + nrecv, sizeof(*c->slots));
	c->free_send = calloc(nsend, sizeof(*c->free_send));
	c->free_recv = calloc(nrecv, sizeof(*c->free_recv));
	for (i = 0; i < nsend; i++)
		c->free_send[c->nfree_send++] = i;
	for (i = 0; i < nrecv; i++)
		c->free_recv[c->nfree_recv++] = nsend + i;
	atomic_store(&c->ok, true);
	snprintf(c->peer, sizeof(c->peer), "rdma:test");
	return c;
}

static void fake_conn_free(struct nrdma_conn *c)
{
	pthread_mutex_destroy(&c->slot_lock);
	free(c->slots);
	free(c->free_send);
	free(c->free_recv);
	free(c);
}

Test(rdma_wc, completions_carry_op_len_and_imm)
{
	struct nrdma_conn *c = fake_conn(2, 2);
	struct net_wr rd = { .op = NET_WR_READ, .wr_id = 11, .len = 100 };
	struct net_wr wr = { .op = NET_WR_WRITE, .wr_id = 12, .len = 40 };
	struct net_wr rv = { .op = NET_WR_RECV, .wr_id = 13, .len = 4096 };
	struct net_wr extra = { .op = NET_WR_SEND, .wr_id = 14, .len = 1 };
	struct ibv_wc w = { 0 };
	struct net_wc out;
	struct net_stats st;
	uint32_t i_rd, i_wr, i_rv, i_x;

	cr_assert_eq(nrdma_slot_get(c, false, &rd, &i_rd), 0);
	cr_assert_eq(nrdma_slot_get(c, false, &wr, &i_wr), 0);
	cr_assert_eq(nrdma_slot_get(c, false, &extra, &i_x), -ENOMEM, "send queue is full");
	cr_assert_eq(nrdma_slot_get(c, true, &rv, &i_rv), 0);
	cr_assert_geq(i_rv, c->nsend, "recv slots follow the send slots");

	/* a WRITE_WITH_IMM from the peer lands in our RECV */
	w.wr_id = i_rv;
	w.status = IBV_WC_SUCCESS;
	w.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
	w.byte_len = 77;
	w.imm_data = htonl(0xdeadbeef);
	cr_assert(nrdma_wc_convert(c, &w, &out));
	cr_assert_eq(out.wr_id, 13);
	cr_assert_eq(out.op, NET_WC_RECV_IMM);
	cr_assert_eq(out.imm, 0xdeadbeef);
	cr_assert_eq(out.byte_len, 77);
	cr_assert_eq(out.status, 0);

	/* our WRITE succeeds */
	memset(&w, 0, sizeof(w));
	w.wr_id = i_wr;
	w.opcode = IBV_WC_RDMA_WRITE;
	cr_assert(nrdma_wc_convert(c, &w, &out));
	cr_assert_eq(out.wr_id, 12);
	cr_assert_eq(out.op, NET_WC_WRITE);
	cr_assert(atomic_load(&c->ok));

	/* our READ fails: on an error wc only wr_id and status are valid, so
	 * the op must come from the slot; the conn is broken afterwards */
	memset(&w, 0, sizeof(w));
	w.wr_id = i_rd;
	w.status = IBV_WC_REM_ACCESS_ERR;
	w.opcode = (enum ibv_wc_opcode)0x7f;
	cr_assert(nrdma_wc_convert(c, &w, &out));
	cr_assert_eq(out.wr_id, 11);
	cr_assert_eq(out.op, NET_WC_READ);
	cr_assert_eq(out.status, -DKV_E_GRANT);
	cr_assert_not(atomic_load(&c->ok));

	/* a wr_id never posted (or already completed) is refused, not trusted */
	w.wr_id = i_rd;
	cr_assert_not(nrdma_wc_convert(c, &w, &out));
	w.wr_id = 1000;
	cr_assert_not(nrdma_wc_convert(c, &w, &out));

	nrdma_conn_stats(&c->head, &st);
	cr_assert_eq(st.ops_completed, 3);
	cr_assert_eq(st.ops_failed, 1);
	cr_assert_eq(st.bytes_sent, 40);
	cr_assert_eq(st.bytes_recv, 77);
	cr_assert(nrdma_drained(c));
	/* every slot went back: both queues are full size again */
	cr_assert_eq(c->nfree_send, 2);
	cr_assert_eq(c->nfree_recv, 2);
	fake_conn_free(c);
}

Test(rdma_wc, post_checks_before_touching_the_qp)
{
	struct nrdma_domain d = { .head.ops = &net_rdma_ops, .head.kind = NET_RDMA };
	struct nrdma_conn *c = fake_conn(1, 1);
	char mem[80];
	char *buf = mem + 8; /* registered: [buf, buf + 64) */
	struct nrdma_mr m = { .pub = { .addr = buf, .len = 64, .lkey = 5 }, .d = &d };
	struct net_wr wr = { .op = NET_WR_WRITE, .local = buf, .len = 8, .lkey = 5 };

	pthread_rwlock_init(&d.mr_lock, NULL);
	d.mrs = &m;
	c->d = &d;
	cr_assert(nrdma_local_ok(&d, buf, 64, 5));
	cr_assert(nrdma_local_ok(&d, buf + 60, 4, 5));
	cr_assert_not(nrdma_local_ok(&d, buf + 60, 5, 5), "past the end");
	cr_assert_not(nrdma_local_ok(&d, buf, 8, 6), "wrong lkey");
	cr_assert_not(nrdma_local_ok(&d, buf - 1, 8, 5), "before the start");

	/* bad lkey / out of range: -EINVAL without reaching ibv_post_send */
	wr.lkey = 6;
	cr_assert_eq(nrdma_post(&c->head, &wr), -EINVAL);
	wr.lkey = 5;
	wr.len = 65;
	cr_assert_eq(nrdma_post(&c->head, &wr), -EINVAL);
	/* broken conn: -ENOTCONN */
	atomic_store(&c->ok, false);
	wr.len = 8;
	cr_assert_eq(nrdma_post(&c->head, &wr), -ENOTCONN);
	cr_assert(nrdma_drained(c));
	fake_conn_free(c);
	pthread_rwlock_destroy(&d.mr_lock);
}

/* Past a (fake) domain, listen and connect reach librdmacm, which has no
 * rdma_cm device here: they must fail with an error, return nothing, and
 * unwind a half-built conn cleanly (ASan builds check the unwinding). */
Test(rdma_nodev, listen_and_connect_fail_cleanly)
{
	struct nrdma_domain d = { .head.ops = &net_rdma_ops, .head.kind = NET_RDMA };
	struct net_listener *l = NULL;
	struct net_conn *c = NULL;
	uint8_t priv[NET_PRIV_MAX] = { 1 };
	size_t rlen = 0;
	int rc;

	skip_if_device();
	pthread_rwlock_init(&d.mr_lock, NULL);
	rc = net_rdma_ops.listen(&d.head, "127.0.0.1:0", &l);
	cr_assert_lt(rc, 0);
	cr_assert_null(l);
	rc = net_rdma_ops.connect(&d.head, "127.0.0.1:1", NULL, priv, NET_PRIV_MAX - 1, &c, NULL,
				  &rlen);
	cr_assert_lt(rc, 0);
	cr_assert_neq(rc, -EINVAL, "55 bytes of private data fit a connect request");
	cr_assert_null(c);
	/* the REQ's 56 bytes hold the length byte and 55 bytes of data */
	cr_assert_eq(net_rdma_ops.connect(&d.head, "127.0.0.1:1", NULL, priv, NET_PRIV_MAX, &c,
					  NULL, NULL),
		     -EINVAL);
	cr_assert_eq(net_rdma_ops.connect(&d.head, "no-port", NULL, NULL, 0, &c, NULL, NULL),
		     -EINVAL);
	cr_assert_eq(net_rdma_ops.listen(&d.head, "[::1", &l), -EINVAL);
	cr_assert_null(c);
	pthread_rwlock_destroy(&d.mr_lock);
}
