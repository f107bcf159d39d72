/*
 * shifter_stub.c: a test-only SPANK plugin that accepts Shifter's Slurm
 * options (--image, --volume, --module) and validates them like NERSC's
 * shifter_slurm.so does, without setting up any container.
 *
 * - --image=<type>:<name>   "Invalid image input: must specify image type"
 *                           when there is no type.
 * - --volume=<map>[;<map>]  map = src:dst[:flag[:flag]]; src absolute and
 *                           existing; dst absolute, not under /etc, /var
 *                           (except /var/tmp), /opt/udiImage, and not /opt;
 *                           flags: ro, perNodeCache=size=N[,bs=N][,method=loop]
 *                           [,fs=xfs] (N: number + b,k,m,g,t,p,e, powers of
 *                           1024, > 0).
 * - --module=<m>[,<m>]      names of Shifter modules (or "none").
 *
 * Like the real plugin, the last --volume/--module given wins.
 * The job and its steps get SHIFTER_IMAGE, SHIFTER_IMAGETYPE, SHIFTER_VOLUME
 * and SHIFTER_MODULE.
 *
 * Options are registered with spank_option_register() in slurm_spank_init():
 * Slurm 22.05 ignores a static spank_options table in sbatch/salloc.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <slurm/spank.h>

SPANK_PLUGIN(shifter_stub, 1);

#define ERRLEN 512

static char *opt_image = NULL;
static char *opt_image_type = NULL;
static char *opt_volume = NULL;
static char *opt_module = NULL;

static void set_str(char **dst, const char *src)
{
	free(*dst);
	*dst = src ? strdup(src) : NULL;
}

static int path_under(const char *path, const char *prefix)
{
	size_t n = strlen(prefix);
	if (strncmp(path, prefix, n) != 0)
		return 0;
	return path[n] == '\0' || path[n] == '/';
}

/* strtod + optional unit letter b,k,m,g,t,p,e (powers of 1024). */
static int parse_pnc_size(const char *s, double *out)
{
	char *end = NULL;
	double v;
	const char *units = "bkmgtpe";
	const char *u;

	errno = 0;
	v = strtod(s, &end);
	if (end == s || errno)
		return -1;
	if (*end) {
		u = strchr(units, tolower((unsigned char)*end));
		if (!u || end[1] != '\0')
			return -1;
		for (int i = 0; i < (u - units); i++)
			v *= 1024.0;
	}
	*out = v;
	return 0;
}

static int validate_pernodecache(const char *args, char *err)
{
	char *copy = strdup(args), *save = NULL, *kv;
	int have_size = 0, rc = 0;

	for (kv = strtok_r(copy, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
		char *eq = strchr(kv, '=');
		double v;
		if (!eq) {
			snprintf(err, ERRLEN, "Invalid configuration for perNodeCache: '%s' "
				 "(expected key=value)", kv);
			rc = -1;
			break;
		}
		*eq = '\0';
		if (!strcmp(kv, "size") || !strcmp(kv, "bs")) {
			if (parse_pnc_size(eq + 1, &v) < 0 || v <= 0) {
				snprintf(err, ERRLEN, "Invalid size for perNodeCache: "
					 "%s=%s (use a number > 0 with an optional unit "
					 "b,k,m,g,t,p,e)", kv, eq + 1);
				rc = -1;
				break;
			}
			if (!strcmp(kv, "size"))
				have_size = 1;
		} else if (!strcmp(kv, "method")) {
			if (strcmp(eq + 1, "loop")) {
				snprintf(err, ERRLEN, "Invalid configuration for perNodeCache: "
					 "method=%s (only method=loop)", eq + 1);
				rc = -1;
				break;
			}
		} else if (!strcmp(kv, "fs")) {
			if (strcmp(eq + 1, "xfs")) {
				snprintf(err, ERRLEN, "Invalid configuration for perNodeCache: "
					 "fs=%s (only fs=xfs)", eq + 1);
				rc = -1;
				break;
			}
		} else {
			snprintf(err, ERRLEN, "Invalid configuration for perNodeCache: "
				 "unknown key '%s'", kv);
			rc = -1;
			break;
		}
	}
	if (!rc && !have_size) {
		snprintf(err, ERRLEN, "Invalid configuration for perNodeCache: size= "
			 "is required, e.g. perNodeCache=size=50G");
		rc = -1;
	}
	free(copy);
	return rc;
}

static int validate_map(const char *map, char *err)
{
	char *copy = strdup(map), *save = NULL;
	char *src = strtok_r(copy, ":", &save);
	char *dst = strtok_r(NULL, ":", &save);
	char *flag;
	struct stat st;
	int rc = -1;

	if (!src || !dst || !*src || !*dst) {
		snprintf(err, ERRLEN, "Invalid volume map '%s': expected "
			 "/source:/destination[:flags]", map);
		goto out;
	}
	if (src[0] != '/') {
		snprintf(err, ERRLEN, "Invalid volume map '%s': source '%s' must be "
			 "an absolute path", map, src);
		goto out;
	}
	if (stat(src, &st) != 0) {
		snprintf(err, ERRLEN, "Invalid volume map '%s': source '%s' does not "
			 "exist", map, src);
		goto out;
	}
	if (dst[0] != '/') {
		snprintf(err, ERRLEN, "Invalid volume map '%s': destination '%s' "
			 "must be an absolute path", map, dst);
		goto out;
	}
	if ((path_under(dst, "/etc") ||
	     (path_under(dst, "/var") && !path_under(dst, "/var/tmp")) ||
	     path_under(dst, "/opt/udiImage") || !strcmp(dst, "/opt") ||
	     !strcmp(dst, "/opt/"))) {
		snprintf(err, ERRLEN, "Invalid volume map '%s': destination '%s' is "
			 "not allowed (/etc, /var except /var/tmp, /opt/udiImage and "
			 "/opt are reserved)", map, dst);
		goto out;
	}
	while ((flag = strtok_r(NULL, ":", &save))) {
		if (!strcmp(flag, "ro"))
			continue;
		if (!strncmp(flag, "perNodeCache=", 13)) {
			if (validate_pernodecache(flag + 13, err) < 0)
				goto out;
			continue;
		}
		if (!strcmp(flag, "rec") || !strcmp(flag, "slave") ||
		    !strcmp(flag, "private")) {
			snprintf(err, ERRLEN, "Invalid volume map '%s': flag '%s' is "
				 "reserved for site configuration", map, flag);
			goto out;
		}
		snprintf(err, ERRLEN, "Invalid volume map '%s': unknown flag '%s' "
			 "(allowed: ro, perNodeCache=size=...)", map, flag);
		goto out;
	}
	rc = 0;
out:
	free(copy);
	return rc;
}

static int validate_volume(const char *value, char *err)
{
	char *copy, *save = NULL, *map;
	int rc = 0, n = 0;

	if (!value || !*value) {
		snprintf(err, ERRLEN, "Invalid volume: empty --volume");
		return -1;
	}
	copy = strdup(value);
	for (map = strtok_r(copy, ";", &save); map; map = strtok_r(NULL, ";", &save)) {
		n++;
		if (validate_map(map, err) < 0) {
			rc = -1;
			break;
		}
	}
	if (!rc && !n) {
		snprintf(err, ERRLEN, "Invalid volume: no map in '%s'", value);
		rc = -1;
	}
	free(copy);
	return rc;
}

static int cb_image(int val, const char *optarg, int remote)
{
	const char *colon;
	char type[64];

	if (!optarg || !*optarg) {
		slurm_error("Invalid image input: empty --image");
		return -1;
	}
	colon = strchr(optarg, ':');
	if (!colon || colon == optarg || !colon[1]) {
		slurm_error("Invalid image input: must specify image type");
		return -1;
	}
	if ((size_t)(colon - optarg) >= sizeof(type)) {
		slurm_error("Invalid image input: image type too long");
		return -1;
	}
	memcpy(type, optarg, colon - optarg);
	type[colon - optarg] = '\0';
	for (char *c = type; *c; c++) {
		if (!isalnum((unsigned char)*c) && *c != '_') {
			slurm_error("Invalid image input: bad image type '%s'", type);
			return -1;
		}
	}
	set_str(&opt_image_type, type);
	set_str(&opt_image, colon + 1);
	return 0;
}

static int cb_volume(int val, const char *optarg, int remote)
{
	char err[ERRLEN] = "";

	if (validate_volume(optarg, err) < 0) {
		slurm_error("%s", err);
		return -1;
	}
	set_str(&opt_volume, optarg);
	return 0;
}

static int cb_module(int val, const char *optarg, int remote)
{
	if (!optarg || !*optarg) {
		slurm_error("Invalid module input: empty --module");
		return -1;
	}
	for (const char *c = optarg; *c; c++) {
		if (!isalnum((unsigned char)*c) && !strchr(",_.-", *c)) {
			slurm_error("Invalid module input: '%s'", optarg);
			return -1;
		}
	}
	set_str(&opt_module, optarg);
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	struct spank_option opts[] = {
		{ "image", "type:name", "Shifter image, e.g. docker:ubuntu:22.04 "
		  "(test stub)", 1, 0, cb_image },
		{ "volume", "src:dst[:flags][;...]", "Shifter volume maps "
		  "(test stub)", 1, 0, cb_volume },
		{ "module", "name[,name]", "Shifter modules (test stub)", 1, 0,
		  cb_module },
	};
	spank_context_t ctx = spank_context();

	if (ctx != S_CTX_LOCAL && ctx != S_CTX_ALLOCATOR && ctx != S_CTX_REMOTE)
		return ESPANK_SUCCESS;
	for (size_t i = 0; i < sizeof(opts) / sizeof(opts[0]); i++) {
		spank_err_t rc = spank_option_register(sp, &opts[i]);
		if (rc != ESPANK_SUCCESS) {
			slurm_error("shifter_stub: cannot register --%s: %s",
				    opts[i].name, spank_strerror(rc));
			return -1;
		}
	}
	return ESPANK_SUCCESS;
}

static void export_env(spank_t sp)
{
	if (opt_image) {
		spank_setenv(sp, "SHIFTER_IMAGE", opt_image, 1);
		spank_setenv(sp, "SHIFTER_IMAGETYPE", opt_image_type, 1);
	}
	if (opt_volume)
		spank_setenv(sp, "SHIFTER_VOLUME", opt_volume, 1);
	if (opt_module)
		spank_setenv(sp, "SHIFTER_MODULE", opt_module, 1);
}

int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	if (spank_remote(sp))
		export_env(sp);
	return ESPANK_SUCCESS;
}

int slurm_spank_exit(spank_t sp, int ac, char **av)
{
	set_str(&opt_image, NULL);
	set_str(&opt_image_type, NULL);
	set_str(&opt_volume, NULL);
	set_str(&opt_module, NULL);
	return ESPANK_SUCCESS;
}
