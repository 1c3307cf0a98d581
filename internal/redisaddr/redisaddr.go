// Package redisaddr parses the Redis address the tools and examples of this module accept (the
// -redis flag of stockctl, flashsale and checkout) into a rueidis client option:
//
//	host:port[,host:port...]              addresses (one: rueidis finds out whether it is a
//	                                      cluster node; several: seeds of a cluster)
//	redis://[user[:password]@]host:port[/db][?addr=host:port&...]
//	rediss://...                          the same over TLS (the system's root certificates)
//	unix://[user[:password]@]/path/to/socket
//
// The URL forms are rueidis.ParseURL's: the user and password of a Redis ACL user go in the
// URL, URL-escaped.
//
// ParseSentinel parses the -sentinel flag: the name of the primary the sentinels monitor and
// the sentinels' addresses,
//
//	name@host:port[,host:port...]         a rueidis Sentinel client: it asks the sentinels
//	                                      for the primary of name and follows their
//	                                      +switch-master announcements
package redisaddr

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/redis/rueidis"
)

// Parse parses a Redis address (see the package doc). Its errors never show a password.
func Parse(s string) (rueidis.ClientOption, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "://") {
		opt, err := rueidis.ParseURL(s)
		if err != nil {
			return opt, fmt.Errorf("%q: %v", Redact(s), redactErr(err, s))
		}
		return opt, nil
	}
	var opt rueidis.ClientOption
	for a := range strings.SplitSeq(s, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			continue
		}
		if _, _, err := net.SplitHostPort(a); err != nil {
			return opt, fmt.Errorf("%q: %v (want host:port, redis://..., rediss://... or unix://...)", a, err)
		}
		opt.InitAddress = append(opt.InitAddress, a)
	}
	if len(opt.InitAddress) == 0 {
		return opt, errors.New("no address")
	}
	return opt, nil
}

// ParseSentinel parses a Sentinel address, name@host:port[,host:port...] (see the package doc),
// into the options of a rueidis Sentinel client.
func ParseSentinel(s string) (rueidis.ClientOption, error) {
	var opt rueidis.ClientOption
	name, addrs, ok := strings.Cut(strings.TrimSpace(s), "@")
	name = strings.TrimSpace(name)
	switch {
	case !ok:
		return opt, fmt.Errorf("%q: want name@host:port[,host:port...], the name of the primary the sentinels monitor and their addresses", s)
	case name == "" || strings.ContainsAny(name, " \t,:/"):
		return opt, fmt.Errorf("%q: %q is not a primary name (sentinel monitor <name> ...)", s, name)
	}
	if strings.TrimSpace(addrs) == "" {
		return opt, fmt.Errorf("%q: no sentinel address", s)
	}
	seen := map[string]bool{}
	for a := range strings.SplitSeq(addrs, ",") {
		a = strings.TrimSpace(a)
		if a == "" {
			return opt, fmt.Errorf("%q: an empty sentinel address (want host:port[,host:port...])", s)
		}
		host, port, err := net.SplitHostPort(a)
		if err != nil {
			return opt, fmt.Errorf("sentinel %q: %v (want host:port)", a, err)
		}
		if host == "" || strings.ContainsAny(host, " \t@,/") {
			return opt, fmt.Errorf("sentinel %q: %q is not a host name or address", a, host)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return opt, fmt.Errorf("sentinel %q: port %q is not a number in 1..65535", a, port)
		}
		if seen[a] {
			return opt, fmt.Errorf("%q: sentinel %s given twice", s, a)
		}
		seen[a] = true
		opt.InitAddress = append(opt.InitAddress, a)
	}
	if len(opt.InitAddress) == 0 {
		return opt, fmt.Errorf("%q: no sentinel address", s)
	}
	opt.Sentinel.MasterSet = name
	return opt, nil
}

// Redact hides the password of a Redis URL, for messages.
func Redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	if _, has := u.User.Password(); has {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

func redactErr(err error, s string) error {
	if u, perr := url.Parse(s); perr == nil && u.User != nil {
		if pw, has := u.User.Password(); has && pw != "" {
			return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
		}
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return errors.New(strings.ReplaceAll(ue.Err.Error(), s, Redact(s)))
	}
	return err
}
