package benchutil

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// CPU is a snapshot of the CPU time used so far by this Go process and by
// the Redis server. Wall-clock figures (ns/op, commandstats usec) are
// inflated when the machine is shared; CPU time per op is not, and gives
// the capacity each side would have on an idle machine.
type CPU struct {
	Go       time.Duration // user+sys of this process (all threads)
	Redis    time.Duration // used_cpu_user+used_cpu_sys of redis-server
	RedisSys time.Duration // used_cpu_sys: the kernel side (socket I/O)
}

// TakeCPU samples both sides.
func TakeCPU(ctx context.Context, rdb redis.UniversalClient) (CPU, error) {
	var c CPU
	c.Go = processCPU()
	txt, err := rdb.Info(ctx, "cpu").Result()
	if err != nil {
		return c, err
	}
	for _, line := range strings.Split(txt, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_user" && k != "used_cpu_sys") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return c, err
		}
		c.Redis += time.Duration(f * float64(time.Second))
		if k == "used_cpu_sys" {
			c.RedisSys = time.Duration(f * float64(time.Second))
		}
	}
	return c, nil
}

// Sub returns c - o.
func (c CPU) Sub(o CPU) CPU {
	return CPU{Go: c.Go - o.Go, Redis: c.Redis - o.Redis, RedisSys: c.RedisSys - o.RedisSys}
}
