# scripts/tcp-mount.sh — sourced by the benchmarks that measure bytes on the
# wire (bench-bytes.sh, bench-copy.sh): a memory node on 127.0.0.1 over tcp
# (region of $SIZE, files in $DIR) and dkvfs mounted on it at $MNT with
# transport=tcp.  tcp_mount_start starts both (exits on failure); the EXIT
# trap it sets unmounts, stops the node and removes $DIR.  stat_of KEY reads
# one .dkvfs/stats counter, wire the daemon's bytes sent + received.

tcp_mount_cleanup() {
	fusermount3 -u -z "$MNT" 2>/dev/null
	[ -n "${NODE:-}" ] && kill "$NODE" 2>/dev/null && wait "$NODE" 2>/dev/null
	rm -rf "$DIR"
}

stat_of() { sed -n "s/^$1: //p" "$MNT/.dkvfs/stats"; }
wire() { echo $(( $(stat_of net_bytes_sent) + $(stat_of net_bytes_recv) )); }

tcp_mount_start() {
	local port=$((20000 + RANDOM % 20000))
	NODE=
	trap tcp_mount_cleanup EXIT INT TERM
	mkdir -p "$MNT" || exit 1
	"$BUILD/dkvfs-memnode" --listen "127.0.0.1:$port" --size "$SIZE" --transport tcp \
		--insecure --local-dir "$DIR" 2>"$DIR/node.log" &
	NODE=$!
	for _ in $(seq 50); do
		"$BUILD/dkvfs" -o "memnode=127.0.0.1:$port,transport=tcp,log_file=$DIR/dkvfs.log" \
			"$MNT" 2>/dev/null && break
		sleep 0.2
	done
	mountpoint -q "$MNT" || { echo "mount failed: $(tail -3 "$DIR/dkvfs.log")" >&2; exit 1; }
}
